"""Errors of the vehicle master.

Each maps to one HTTP status in the admin API, so the API's error handler is a table, not logic:
bad input is a 422 with the field that is wrong, a stale `If-Match` is a 412, and so on.
"""

from __future__ import annotations

from fleetfence.errors import FleetFenceError


class MasterError(FleetFenceError):
    """Base of every vehicle-master error."""


class MasterValidationError(MasterError):
    """Input does not describe a valid entity; `loc` names the offending field."""

    def __init__(self, message: str, loc: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.loc = loc


class GeometryError(MasterValidationError, ValueError):
    """A GeoJSON geometry is unusable. Also a ValueError so pydantic validators report it as a
    field error (422) instead of crashing."""


class UnknownReferenceError(MasterValidationError):
    """An assignment names a vehicle or route that does not exist."""


class NotFoundError(MasterError):
    """The entity does not exist (or was deleted)."""


class AlreadyExistsError(MasterError):
    """A create found the entity already there."""


class VersionConflictError(MasterError):
    """`If-Match` named a version other than the current one (optimistic concurrency)."""

    def __init__(self, message: str, current_version: int) -> None:
        super().__init__(message)
        self.current_version = current_version


class InUseError(MasterError):
    """The entity is still referenced (a route or vehicle with an assignment)."""


class CredentialsExistError(AlreadyExistsError):
    """The vehicle already has MQTT credentials that work or are disabled: rotate them instead."""


class NoCredentialsError(NotFoundError):
    """The vehicle has no MQTT credentials to rotate, disable or enable (never issued, or revoked)."""


class TrackerBoundError(AlreadyExistsError):
    """The tracker is bound to another vehicle: one tracker speaks for one vehicle at a time."""
