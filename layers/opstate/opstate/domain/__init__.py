"""The pure domain of gemini-opstate: what an operation's state is and how it may change.

Owns the states and their ranks (``states``), exact instants (``times``), operation names and
their keys (``names``), the events read from webhooks, reports and polls (``events``), the one
decision (``reducer``), the record and its types (``model``), how a record is shown
(``views``), strict JSON reading (``strict_json``), the bounds on an event's details
(``details``) and the API's paths (``routes``).

May import the standard library and these modules only: no AWS, HTTP, Gemini or pydantic code,
no clock, no settings (tests/unit/test_purity.py and tests/unit/test_layers.py check it). This
``__init__`` imports nothing: ``import opstate.domain.states`` loads that module alone.
"""
