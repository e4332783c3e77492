"""gemini-opstate: monotonic state records for Gemini long-running operations.

The domain modules (``states``, ``times``, ``names``, ``events``, ``reducer``) are pure: they
import no AWS, HTTP or Gemini code and read no clock. Adapters (stores, API, reconciler,
notifier) depend on them, never the reverse.
"""

__version__ = "0.1.0"
