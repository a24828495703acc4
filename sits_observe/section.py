"""The base of every config section (kept apart so subsystem sections and config.py import it freely)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, SecretStr

__all__ = ["Section", "SigningKey"]


class Section(BaseModel):
    """Base of every config section: unknown keys are errors (a typo must not pass silently)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _not_blank(v: SecretStr) -> SecretStr:
    if not v.get_secret_value().strip():
        raise ValueError("must not be empty (an empty HMAC key signs nothing a receiver can trust); leave it unset "
                         "to send unsigned")
    return v


SigningKey = Annotated[SecretStr, AfterValidator(_not_blank)]
"""An HMAC key from the config: a secret that is never echoed, refused when empty or blank."""
