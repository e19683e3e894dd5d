"""boto3 sessions from the usual AWS chain (profile, environment, SSO), and AWS errors in cloudtrain's words."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cloudtrain.errors import CapacityError, CloudtrainError, CredentialsError, SpecError, TransientError, UserError

_AUTH_CODES = {"ExpiredToken", "ExpiredTokenException", "UnrecognizedClientException", "InvalidClientTokenId",
               "InvalidSignatureException", "SignatureDoesNotMatch", "AccessDenied", "AccessDeniedException"}
# Codes botocore's own retry handlers treat as throttling or transient (botocore.retries.standard), plus 5xx
_TRANSIENT_CODES = {"Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException",
                    "TooManyRequestsException", "RequestLimitExceeded", "SlowDown", "RequestTimeout",
                    "RequestTimeoutException", "PriorRequestNotComplete", "ServiceUnavailable", "InternalFailure",
                    "InternalError", "InternalServerError"}
# CreateTrainingJob's declared quota error (service model: ResourceLimitExceeded); a job that fails for capacity
# says CapacityError / InsufficientCapacityError in its FailureReason (sagemaker-core checks "CapacityError" in it)
CAPACITY_CODES = {"ResourceLimitExceeded", "CapacityError", "InsufficientCapacityError"}
_LOGIN_HINT = ("log in again (`aws sso login`, or `aws configure`), or choose a profile with AWS_PROFILE; "
               "see `aws sts get-caller-identity`")


def configured_region(region: str | None) -> str:
    """The region as resolved (the spec's, else AWS_REGION / AWS_DEFAULT_REGION, else the cloudtrain profile's, else
    the AWS profile's ``region``, read locally by the ``settings`` hook): required."""
    if not region:
        raise SpecError("no AWS region is set", field="providers.aws.region",
                        remedy="set providers.aws.region (or --set providers.aws.region=us-east-1), AWS_REGION, "
                               "`cloudtrain config set aws.region us-east-1`, or a region in your AWS profile")
    return str(region)


@contextmanager
def aws_errors(action: str) -> Iterator[None]:
    """Missing or expired credentials and refused calls become one-line errors with the fix."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        HTTPClientError,
        NoCredentialsError,
        NoRegionError,
        PartialCredentialsError,
        TokenRetrievalError,
        UnauthorizedSSOTokenError,
    )
    from botocore.exceptions import (
        ConnectionError as BotoConnectionError,
    )

    try:
        yield
    except (NoCredentialsError, PartialCredentialsError) as exc:
        raise CredentialsError(f"{action}: no AWS credentials found ({exc})", remedy=_LOGIN_HINT) from None
    except (TokenRetrievalError, UnauthorizedSSOTokenError) as exc:
        raise CredentialsError(f"{action}: the AWS SSO session has expired ({exc})", remedy=_LOGIN_HINT) from None
    except NoRegionError:
        raise SpecError(f"{action}: no AWS region is set", field="providers.aws.region",
                        remedy="set providers.aws.region or AWS_REGION") from None
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code, message = error.get("Code", "?"), error.get("Message", str(exc))
        if code in _AUTH_CODES:
            raise CredentialsError(f"{action}: AWS refused the credentials ({code}: {message})",
                                   remedy=_LOGIN_HINT) from None
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if code in _TRANSIENT_CODES or status >= 500 or status == 429:
            raise TransientError(f"{action}: {code}: {message}", remedy="try again; AWS answered with an error "
                                                                       "that passes") from None
        if code in CAPACITY_CODES:  # a service quota, per instance type and region, or no capacity
            raise CapacityError(f"{action}: {code}: {message}",
                                remedy="request a higher SageMaker quota for this instance type (Service Quotas "
                                       "console, 'training job usage' / 'spot training job usage'), or pick another "
                                       "instance type, region or provider (`cloudtrain catalog -p aws`)") from None
        if code in ("ValidationException", "ResourceNotFound"):
            raise UserError(f"{action}: {code}: {message}") from None
        raise CloudtrainError(f"{action}: {code}: {message}", remedy="try again; if it persists, check the AWS "
                                                                    "console for the job") from None
    except (BotoConnectionError, HTTPClientError) as exc:  # timeouts, resets, unreachable endpoints
        raise TransientError(f"{action}: {exc}", remedy="check the network and the AWS endpoint") from None
    except BotoCoreError as exc:
        raise CloudtrainError(f"{action}: {exc}", remedy="check the network and the AWS endpoint") from None


def session(region: str) -> Any:
    import boto3

    return boto3.session.Session(region_name=region)
