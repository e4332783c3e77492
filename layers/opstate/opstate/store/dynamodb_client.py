"""The DynamoDB client this store builds, and which of its errors mean "try again later".

Faults (throttling, 5xx, timeouts, connection errors, missing table or credentials) raise
``StoreUnavailableError``; a ``ValidationException`` from a write raises ``RecordRejectedError``
(permanent, never retried); other client errors are bugs and propagate as ``ClientError``.
"""

from __future__ import annotations

from typing import Any, NoReturn

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    CredentialRetrievalError,
    HTTPClientError,
    NoCredentialsError,
)

from opstate.domain.model import OpRecord
from opstate.store.port import RecordRejectedError, StoreUnavailableError

# The retry policy of every client this module builds: standard mode (exponential backoff with
# jitter, retry quotas, retries throttling and transient errors), short timeouts so a webhook
# answers "retry later" well within its sender's timeout.
CLIENT_CONFIG = Config(
    retries={"mode": "standard", "total_max_attempts": 3},
    connect_timeout=2,
    read_timeout=5,
    max_pool_connections=32,
)

# Error codes that mean "the store is not available right now", not "this request is wrong".
UNAVAILABLE_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "Throttling",
        "RequestLimitExceeded",
        "LimitExceededException",
        "InternalServerError",
        "InternalFailure",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "RequestTimeout",
        "RequestTimeoutException",
        "TransactionConflictException",
        "TransactionInProgressException",
        "ResourceNotFoundException",
        "ResourceInUseException",
        "TableNotFoundException",
        "UnrecognizedClientException",
        "ExpiredTokenException",
        "AccessDeniedException",
        "InvalidSignatureException",
        "MissingAuthenticationTokenException",
    }
)

CONDITION_FAILED = "ConditionalCheckFailedException"
_VALIDATION = "ValidationException"


def make_client(endpoint_url: str | None = None, config: Config | None = None) -> Any:
    """A low-level DynamoDB client with the standard retry mode.

    ``endpoint_url`` is passed only when given, so boto3 keeps honouring
    ``AWS_ENDPOINT_URL_DYNAMODB`` / ``AWS_ENDPOINT_URL`` (moto server, DynamoDB Local).
    """
    kwargs: dict[str, Any] = {"config": config or CLIENT_CONFIG}
    if endpoint_url is not None:
        kwargs["endpoint_url"] = endpoint_url
    return boto3.client("dynamodb", **kwargs)


def is_unavailable(exc: BaseException) -> bool:
    """True for the faults that mean "try again later" (see ``UNAVAILABLE_CODES``)."""
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        return code in UNAVAILABLE_CODES or status >= 500
    return isinstance(
        exc, ConnectionError | HTTPClientError | NoCredentialsError | CredentialRetrievalError
    )


def fault(exc: ClientError | BotoCoreError, action: str) -> NoReturn:
    """Raise ``StoreUnavailableError`` for a fault, or ``exc`` itself for a bug."""
    if is_unavailable(exc):
        raise StoreUnavailableError(f"DynamoDB {action} failed: {exc}") from exc
    raise exc


def refused(exc: ClientError, record: OpRecord) -> None:
    """Raise ``RecordRejectedError`` if DynamoDB refused ``record``'s item itself
    (``ValidationException``: permanent, never retried); return otherwise."""
    if exc.response.get("Error", {}).get("Code") == _VALIDATION:
        message = exc.response.get("Error", {}).get("Message", "")
        raise RecordRejectedError(f"DynamoDB refused the item of {record.name}: {message}") from exc
