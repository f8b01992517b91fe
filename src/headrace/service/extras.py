"""What each of headrace's extras brings, and the line a command says when its extra is missing.

`pip install headrace` is the scheduler, its CLI and both stores. The rest comes as extras
(pyproject.toml's `[project.optional-dependencies]`):

- `moderation`: the moderation pipeline's media stack and S3 (`demo moderation`, `event close`,
  a worker of the moderation app);
- `service`: the HTTP API, the moderator page and its metrics (`serve`), with `moderation`, the
  pipeline it serves.

A command of an extra is imported only when it runs (`cli.LazyGroup`); when the extra's modules
are not installed it is a stand-in that fails in one line naming the extra, with exit status 2.
An app of headrace's own (`headrace worker headrace.pipelines.moderation.deploy:make_app`) whose
module needs a missing extra fails the same way (`apps.load_app`).
"""

from __future__ import annotations

import importlib.util
import sys

import click

from headrace.service.failures import WrongInput

# The modules each extra's distributions provide, by the name they are imported under.
MODERATION = ("av", "PIL", "pyvips", "obstore", "matplotlib")
SERVICE = ("fastapi", "jinja2", "python_multipart", "swagger_ui_bundle", "prometheus_client")
MODULES = {"moderation": MODERATION, "service": (*SERVICE, *MODERATION)}


def missing(extra: str) -> tuple[str, ...]:
    """The modules of `extra` that cannot be imported here."""
    return tuple(name for name in MODULES[extra] if not _importable(name))


def _importable(name: str) -> bool:
    if name in sys.modules:
        return sys.modules[name] is not None  # None: blocked, as Python's import system reads it
    return importlib.util.find_spec(name) is not None


def extra_of(module: str) -> str | None:
    """The narrowest extra that brings `module` (a dotted name), or None for none."""
    top = module.partition(".")[0]
    return next((extra for extra, names in MODULES.items() if top in names), None)


def needs(what: str, extra: str, lacking: tuple[str, ...]) -> WrongInput:
    """The one-line failure of `what` (a command, an app) when `extra` is not installed."""
    return WrongInput(
        f"{what} needs headrace[{extra}]; install it with: pip install 'headrace[{extra}]' "
        f"(not installed: {', '.join(lacking)})"
    )


def stand_in(name: str, path: str, extra: str, lacking: tuple[str, ...]) -> click.Command:
    """The command `name` (whose command line is `path`) when `extra` is missing: listed with
    what it needs, and failing in one line whatever it is given."""
    failure = needs(path, extra, lacking)

    def fail() -> None:
        raise failure

    return click.Command(
        name,
        callback=fail,
        help=f"Needs headrace[{extra}]: pip install 'headrace[{extra}]'.",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )
