"""Google Cloud (Vertex AI) on the fake Gemini server: the endpoints google-genai 3.6.1 calls
in enterprise mode, and the OAuth endpoints google-auth exchanges credentials at.

``GoogleCloudSide(fake)`` installs routes on a ``FakeGemini`` (point the SDK at it with
``GOOGLE_VERTEX_BASE_URL=fake.base_url``; resources live in the fake, keyed by full name):

- ``GET projects/P/locations/L/batchPredictionJobs/N``: the job (``cloud_batch_resource``);
- ``GET projects/P/locations/L/batchPredictionJobs``: ``{"batchPredictionJobs",
  "nextPageToken"}`` (``pageSize``, ``pageToken``), names in reverse order;
- ``POST projects/.../publishers/google/models/M:fetchPredictOperation``: the operation the
  body's ``operationName`` names;
- ``POST token`` (``grant_type`` jwt-bearer): a service account's signed JWT -> an access token
  (checked: RS256 by the registered key, ``aud`` Google's token endpoint, ``iss`` the email);
- ``POST v1/token`` (``grant_type`` token-exchange): STS, for an AWS-signed GetCallerIdentity
  request (external_account, ``aws`` source);
- ``POST v1/projects/-/serviceAccounts/E:generateAccessToken``: impersonation of E.

Every Cloud request must carry ``Authorization: Bearer <a token this fake issued>``, else 401.
``refuse = True`` makes the token endpoints answer ``invalid_grant`` (a refused credential, with
a description no log may show: ``REFUSAL_DESCRIPTION``); ``token_requests`` lists the exchanges
seen.

``external_account_info`` points ``token_url`` (and the impersonation URL) at this fake, which
``cloud_credentials_policy`` refuses unless the test turns on its loopback switch
(``loopback_allowed(fake)``, i.e. ``allow_loopback_for_tests``): a module-level hook that only
code in the test process sets, never a setting, a variable or the secret.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, unquote

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from opstate.reconcile.cloud_credentials_policy import allow_loopback_for_tests
from tests.support.fake_gemini import FakeGemini, Request, Response, error_body

JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
AWS_SUBJECT = "urn:ietf:params:aws:token-type:aws4_request"
# google-auth always signs service-account assertions for Google's token endpoint.
OAUTH_AUDIENCE = "https://oauth2.googleapis.com/token"
MODEL = r"projects/[^/]+/locations/[^/]+/publishers/[^/]+/models/[^/]+"
# What a refusing token endpoint says beyond its error code (never to be logged).
REFUSAL_DESCRIPTION = "Invalid JWT Signature. remote-body-marker-7f3a"
WIF_AUDIENCE = (
    "//iam.googleapis.com/projects/123456/locations/global/workloadIdentityPools/aws-pool"
    "/providers/aws-provider"
)


def cloud_batch_resource(
    name: str,
    state: str = "JOB_STATE_RUNNING",
    *,
    update_time: str | None = "2026-05-01T10:00:00Z",
    create_time: str | None = "2026-05-01T09:00:00Z",
    display_name: str | None = None,
    model: str = "publishers/google/models/gemini-2.5-flash",
    gcs_output_directory: str | None = None,
    bigquery_output_table: str | None = None,
    completion_stats: Mapping[str, int] | None = None,
    error: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``BatchPredictionJob`` as ``GET .../batchPredictionJobs/{id}`` returns it (the job
    itself, not an LRO). ``completion_stats`` go out as int64 JSON strings, as REST sends them."""
    if not state.startswith("JOB_STATE_"):
        state = f"JOB_STATE_{state}"
    body: dict[str, Any] = {"name": name, "model": model, "state": state}
    if display_name is not None:
        body["displayName"] = display_name
    if create_time is not None:
        body["createTime"] = create_time
    if update_time is not None:
        body["updateTime"] = update_time
    info: dict[str, str] = {}
    if gcs_output_directory is not None:
        info["gcsOutputDirectory"] = gcs_output_directory
        body["outputConfig"] = {
            "predictionsFormat": "jsonl",
            "gcsDestination": {"outputUriPrefix": gcs_output_directory.rsplit("/", 1)[0]},
        }
    if bigquery_output_table is not None:
        info["bigqueryOutputTable"] = bigquery_output_table
    if info:
        body["outputInfo"] = info
    if completion_stats is not None:
        body["completionStats"] = {k: str(v) for k, v in completion_stats.items()}
    if error is not None:
        body["error"] = dict(error)
    return body


def cloud_video_response(uri: str) -> dict[str, Any]:
    """The ``response`` of a finished Veo operation on Google Cloud."""
    return {
        "@type": "type.googleapis.com/cloud.ai.large_models.vision.GenerateVideoResponse",
        "videos": [{"gcsUri": uri, "mimeType": "video/mp4"}],
    }


def new_rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def private_pem(key: rsa.RSAPrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


class GoogleCloudSide:
    """The Cloud routes of one fake (see the module docstring)."""

    def __init__(self, fake: FakeGemini) -> None:
        self.fake = fake
        self.refuse = False
        self.token_requests: list[str] = []  # grant types, in arrival order
        self._keys: dict[str, Any] = {}  # client_email -> public key
        self._tokens: set[str] = set()
        self._lock = threading.Lock()
        fake.route("POST", r"token", self._token)
        fake.route("POST", r"projects/-/serviceAccounts/[^/]+", self._impersonate)
        fake.route("GET", r"projects/[^/]+/locations/[^/]+/batchPredictionJobs", self._list)
        fake.route("GET", r"projects/.+", self._get)
        fake.route(
            "POST", r"projects/[^/]+/locations/[^/]+/publishers/[^/]+/models/[^/]+", self._op
        )

    # --- credentials ------------------------------------------------------------------------

    def service_account_info(
        self, email: str = "opstate@p1.iam.gserviceaccount.com", project: str = "p1"
    ) -> dict[str, Any]:
        """A service-account key JSON (fresh RSA key) whose ``token_uri`` is this fake."""
        key = new_rsa_key()
        with self._lock:
            self._keys[email] = key.public_key()
        return {
            "type": "service_account",
            "project_id": project,
            "private_key_id": secrets.token_hex(20),
            "private_key": private_pem(key),
            "client_email": email,
            "client_id": "1234567890",
            "token_uri": f"{self.fake.base_url}/token",
        }

    def external_account_info(self, impersonate: str | None = None) -> dict[str, Any]:
        """A workload identity federation JSON with the ``aws`` credential source, exchanging
        at this fake's STS (and impersonating ``impersonate`` when given)."""
        info: dict[str, Any] = {
            "type": "external_account",
            "audience": WIF_AUDIENCE,
            "subject_token_type": AWS_SUBJECT,
            "token_url": f"{self.fake.base_url}/v1/token",
            "credential_source": {
                "environment_id": "aws1",
                "regional_cred_verification_url": (
                    "https://sts.{region}.amazonaws.com?Action=GetCallerIdentity&Version=2011-06-15"
                ),
            },
        }
        if impersonate is not None:
            info["service_account_impersonation_url"] = (
                f"{self.fake.base_url}/v1/projects/-/serviceAccounts/{impersonate}"
                ":generateAccessToken"
            )
        return info

    def issue(self) -> str:
        token = "ya29.fake-" + secrets.token_urlsafe(16)
        with self._lock:
            self._tokens.add(token)
        return token

    def _authorised(self, request: Request) -> bool:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        with self._lock:
            return scheme.lower() == "bearer" and token in self._tokens

    # --- token endpoints -------------------------------------------------------------------

    def _token(self, request: Request) -> Response:
        raw = request.body if isinstance(request.body, str) else ""
        form = {k: v[0] for k, v in parse_qs(raw).items()}
        grant = form.get("grant_type", "")
        self.token_requests.append(grant)
        if self.refuse:
            return 400, {"error": "invalid_grant", "error_description": REFUSAL_DESCRIPTION}
        if grant == JWT_BEARER:
            return self._jwt_grant(form.get("assertion", ""))
        if grant == TOKEN_EXCHANGE:
            return self._exchange(form)
        return 400, {"error": "unsupported_grant_type"}

    def _jwt_grant(self, assertion: str) -> Response:
        try:
            email = jwt.decode(assertion, options={"verify_signature": False})["iss"]
            with self._lock:
                public = self._keys[email]
            jwt.decode(
                assertion,
                public,
                algorithms=["RS256"],
                audience=OAUTH_AUDIENCE,
                issuer=email,
                options={"require": ["exp", "iat", "aud", "iss"]},
            )
        except (jwt.PyJWTError, KeyError):
            return 400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}
        return 200, {"access_token": self.issue(), "expires_in": 3600, "token_type": "Bearer"}

    def _exchange(self, form: Mapping[str, str]) -> Response:
        """STS: the subject token is the URL-encoded JSON of an AWS-signed request."""
        try:
            subject = json.loads(unquote(form.get("subject_token", "")))
            headers = {h["key"].lower(): h["value"] for h in subject["headers"]}
        except (ValueError, KeyError, TypeError):
            return 400, {"error": "invalid_grant", "error_description": "bad subject token"}
        signed = headers.get("authorization", "").startswith("AWS4-HMAC-SHA256 Credential=")
        if (
            form.get("subject_token_type") != AWS_SUBJECT
            or form.get("audience") != WIF_AUDIENCE
            or subject.get("method") != "POST"
            or "Action=GetCallerIdentity" not in str(subject.get("url"))
            or headers.get("x-goog-cloud-target-resource") != WIF_AUDIENCE
            or not signed
        ):
            return 400, {"error": "invalid_grant", "error_description": "not a signed request"}
        return 200, {
            "access_token": self.issue(),
            "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
            "token_type": "Bearer",
            "expires_in": 3600,
        }

    def _impersonate(self, request: Request) -> Response:
        if request.verb != "generateAccessToken" or not self._authorised(request):
            return 401, error_body(401, "Request had invalid authentication credentials.")
        return 200, {"accessToken": self.issue(), "expireTime": "2099-01-01T00:00:00Z"}

    # --- Vertex AI -------------------------------------------------------------------------

    def _list(self, request: Request) -> Response:
        if not self._authorised(request):
            return 401, error_body(401, "Request had invalid authentication credentials.")
        prefix = request.name + "/"
        with self.fake._lock:
            items = [
                dict(body)
                for name, body in sorted(self.fake._state.resources.items(), reverse=True)
                if name.startswith(prefix) and "/" not in name[len(prefix) :]
            ]
        size = int((request.query.get("pageSize") or ["50"])[0])
        start = int((request.query.get("pageToken") or ["0"])[0] or 0)
        body: dict[str, Any] = {"batchPredictionJobs": items[start : start + size]}
        if start + size < len(items):
            body["nextPageToken"] = str(start + size)
        return 200, body

    def _get(self, request: Request) -> Response:
        if not self._authorised(request):
            return 401, error_body(401, "Request had invalid authentication credentials.")
        body = self.fake.resource(request.name)
        if request.verb is not None or body is None:
            return 404, error_body(404, f"{request.name} not found")
        return 200, body

    def _op(self, request: Request) -> Response:
        if not self._authorised(request):
            return 401, error_body(401, "Request had invalid authentication credentials.")
        if request.verb != "fetchPredictOperation" or not isinstance(request.body, dict):
            return 404, error_body(404, f"no fake route for {request.path}")
        name = str(request.body.get("operationName", ""))
        body = self.fake.resource(name)
        if not name.startswith(request.name + "/operations/") or body is None:
            return 404, error_body(404, f"{name} not found")
        return 200, body


@contextmanager
def loopback_allowed(fake: FakeGemini) -> Iterator[None]:
    """Let credentials exchange at ``fake`` (on 127.0.0.1) for the block's duration."""
    allow_loopback_for_tests(fake.base_url)
    try:
        yield
    finally:
        allow_loopback_for_tests(None)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
