"""Deleting Runs: one on request (DeleteRun), those past the retention age (the sidecar's
periodic expiry, `psych-sidecar prune`), and all of a tenant's data (`psych-sidecar
delete-tenant`). Each Run goes in one transaction of its own, whole or not at all; each
deletion is recorded in one audit log line of ids and counts, never content."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from enum import Enum, StrEnum
from typing import Protocol

from psych_sidecar.domain.errors import field_required, run_not_found
from psych_sidecar.domain.runlog.services import RunService
from psych_sidecar.domain.runlog.specs import validate_name

audit = logging.getLogger("psych_sidecar.audit")


class DeletionCause(StrEnum):
    """Why a Run was deleted, as its audit line says."""

    REQUEST = "DeleteRun"
    RETENTION = "retention"
    TENANT = "tenant deletion"


@dataclass(frozen=True, slots=True)
class DeletedRun:
    run_id: str
    tenant: str
    record_count: int


class ExpiryHeld(Enum):
    """Another sidecar (or `prune`) is deleting an expired Run at this moment."""

    ELSEWHERE = "elsewhere"


@dataclass(frozen=True, slots=True)
class TenantSettingsDeleted:
    connections: int
    oauth_grants: int
    sign_ins: int


@dataclass(frozen=True, slots=True)
class ExpiryPass:
    """What one pass of the retention did: the Runs it deleted, and whether it stopped
    because another deleter held the expiry (rather than because none was left or it reached
    its limit)."""

    deleted: list[DeletedRun]
    held_elsewhere: bool


class RunDeletionRepository(Protocol):
    def delete_run(self, run_id: str) -> DeletedRun | None:
        """Delete the Run and every row stored for it in one transaction (after the appends
        that hold its row); None when there is no such Run."""
        ...

    def delete_expired_run(self, created_before: datetime) -> DeletedRun | ExpiryHeld | None:
        """Delete the oldest Run created before `created_before`, in one transaction that only
        one deleter at a time runs (ExpiryHeld when another holds it); None when none is
        that old."""
        ...

    def tenant_run_ids(self, tenant: str, limit: int) -> list[str]:
        """Up to `limit` ids of the tenant's Runs."""
        ...

    def delete_tenant_settings(self, tenant: str) -> TenantSettingsDeleted:
        """Delete the tenant's connections (their sealed secrets), catalogues, OAuth grants
        and begun sign-ins, in one transaction."""
        ...


class RunDeletion:
    def __init__(self, runs: RunService, repository: RunDeletionRepository) -> None:
        self._runs = runs
        self._repository = repository

    def delete(self, run_id: str, cause: DeletionCause = DeletionCause.REQUEST) -> DeletedRun:
        if not run_id:
            raise field_required("run_id")
        deleted = self._repository.delete_run(run_id)
        self._runs.forget(run_id)
        if deleted is None:
            raise run_not_found(run_id)
        _audit(deleted, cause)
        return deleted

    def expire(self, created_before: datetime, limit: int) -> ExpiryPass:
        """Delete up to `limit` Runs created before `created_before`, oldest first."""
        deleted: list[DeletedRun] = []
        while len(deleted) < limit:
            outcome = self._repository.delete_expired_run(created_before)
            if outcome is None:
                break
            if outcome is ExpiryHeld.ELSEWHERE:
                return ExpiryPass(deleted, held_elsewhere=True)
            self._runs.forget(outcome.run_id)
            _audit(outcome, DeletionCause.RETENTION)
            deleted.append(outcome)
        return ExpiryPass(deleted, held_elsewhere=False)

    def delete_tenant(self, tenant: str) -> tuple[int, TenantSettingsDeleted]:
        """Delete every Run of the tenant (each in its own transaction), then its
        connections, catalogues, grants and sign-ins; the number of Runs deleted, and the
        rest's counts."""
        validate_name(tenant, "tenant")
        run_count = 0
        while ids := self._repository.tenant_run_ids(tenant, 100):
            for run_id in ids:
                deleted = self._repository.delete_run(run_id)
                self._runs.forget(run_id)
                if deleted is not None:
                    _audit(deleted, DeletionCause.TENANT)
                    run_count += 1
        settings = self._repository.delete_tenant_settings(tenant)
        audit.info(
            "deleted tenant %s (%s): %d runs, %d connections, %d oauth grants, %d sign-ins",
            tenant,
            DeletionCause.TENANT,
            run_count,
            settings.connections,
            settings.oauth_grants,
            settings.sign_ins,
        )
        return run_count, settings


def _audit(deleted: DeletedRun, cause: DeletionCause) -> None:
    audit.info(
        "deleted run %s of tenant %s (%s): %d records",
        deleted.run_id,
        deleted.tenant,
        cause,
        deleted.record_count,
    )
