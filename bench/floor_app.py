"""The latency benchmark's floor: one Starlette endpoint under uvicorn, with nothing of headrace
behind it, to show what the HTTP stack and the loopback cost on this machine."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


async def ok(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


app = Starlette(routes=[Route("/", ok)])
