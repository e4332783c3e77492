"""The HTTP routes of the API, written once.

``api`` registers them, ``local.apigw`` turns local requests into the API Gateway events of these
routes, and ``opstate serve`` prints them. ``template.yaml`` declares the same paths (a unit
test keeps the two equal). Imports nothing.
"""

from __future__ import annotations

# POST: a Gemini webhook delivery (public; the signature is checked by the function).
WEBHOOK_PATH = "/gemini/webhook"
# POST: a Google Cloud Pub/Sub push delivery (public; its OIDC token is checked by the function).
PUBSUB_PATH = "/google-cloud/pubsub"
# GET / PUT: one operation's record, the name following the prefix (slashes included).
OPERATIONS_PREFIX = "/operations/"
# The operations route as API Gateway declares it (template.yaml, an event's ``routeKey``).
OPERATIONS_PATH = OPERATIONS_PREFIX + "{name+}"
