"""The moderation pipeline: its stages on the runtime (pipeline.py), the media store
(media.py), what a file is and whether it is within limits (probe.py), the malware scan
(scan.py), derivatives (derive.py), and sample media made on the spot (samples.py)."""
