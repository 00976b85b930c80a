"""platform-gateway-client: typed sync (`Client`) and async (`AsyncClient`) clients of the Platform Gateway API.

    from platform_gateway_client import Client

    with Client("http://localhost:8000", token=get_token) as api:
        record = api.entities.records.create("deals", {"name": "ACME", "fields": {"title": "ACME"}})
        for deal in api.entities.records.iter("deals", filters={"stage": "won"}):
            ...

Models (TypedDicts generated from the API's OpenAPI document) are in `platform_gateway_client.models`,
exceptions (one per error code, each with `details`) in `platform_gateway_client.errors`.
"""

from platform_gateway_client import errors, models
from platform_gateway_client._async import AsyncClient
from platform_gateway_client._core import Call, RetryPolicy, Tagged, __version__
from platform_gateway_client._sync import Client
from platform_gateway_client.errors import (
    ApiError,
    ConflictError,
    ForbiddenError,
    GatewayTimeoutError,
    IdempotencyKeyReusedError,
    InvalidInputError,
    JobFailedError,
    NotFoundError,
    PayloadTooLargeError,
    PlatformGatewayError,
    PreconditionFailedError,
    RateLimitedError,
    ServiceUnavailableError,
    SystemError_,
    TransportError,
    UnauthorizedError,
    ValidationError,
    WaitTimeoutError,
)

__all__ = [
    "ApiError", "AsyncClient", "Call", "Client", "ConflictError", "ForbiddenError", "GatewayTimeoutError",
    "IdempotencyKeyReusedError", "InvalidInputError", "JobFailedError", "NotFoundError", "PayloadTooLargeError",
    "PlatformGatewayError", "PreconditionFailedError", "RateLimitedError", "RetryPolicy", "ServiceUnavailableError",
    "SystemError_", "Tagged", "TransportError", "UnauthorizedError", "ValidationError", "WaitTimeoutError",
    "__version__", "errors", "models",
]
