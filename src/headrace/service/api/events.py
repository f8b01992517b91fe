"""Events for admins: `POST /v1/events/{event}/close` closes one (`upkeep.close_event`): it
takes no more uploads, and its settled items go with their media once `closed_events` old
(docs/reference.md, "Retention"). Audited with the admin's name; closing it again changes
nothing and is audited too."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from headrace.pipelines.moderation.pipeline import CLOSED
from headrace.pipelines.moderation.upkeep import close_event
from headrace.service.api.auth import Role
from headrace.service.api.deps import Caller, TheService, require
from headrace.service.api.edge import EdgeRoute
from headrace.service.api.uploads import Event

router = APIRouter(tags=["events"], route_class=EdgeRoute)


class Closed(BaseModel):
    event: str
    state: str
    applied: bool  # False: it was closed before


@router.post(
    "/v1/events/{event}/close",
    response_model=Closed,
    summary="Close an event: no more uploads, and its items go after the retention age",
    responses={
        401: {"description": "no valid bearer token"},
        403: {"description": "not an admin"},
        404: {"description": "no such event for this token"},
    },
)
async def close(event: Event, svc: TheService, who: Caller) -> Closed:
    await require(svc, who, Role.ADMIN, event=event, action="event.closed")
    applied = await close_event(svc.store, event, by=who.name)
    return Closed(event=event, state=CLOSED, applied=applied)
