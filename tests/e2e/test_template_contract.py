"""template.yaml's contract with the code and the issue, checked on the source template.

These need no build and no tools (they run in every pytest run): least-privilege policies, event
sources, routes and their authorisation, that every environment variable the template sets is
one ``opstate.config`` reads, and that the alarms watch metrics the code emits.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.support.cfn_conditions import decided
from tests.support.template import load_template

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "layers" / "opstate" / "opstate"


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_template()


def resources(template: dict[str, Any], type_: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == type_}


def statements(template: dict[str, Any], function: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for policy in template["Resources"][function]["Properties"].get("Policies", []):
        if "Statement" in policy:
            out.extend(policy["Statement"])
    return out


def actions(statement: dict[str, Any]) -> set[str]:
    value = statement["Action"]
    return {value} if isinstance(value, str) else set(value)


def test_webhook_function_may_only_get_put_update_items_read_its_secret_and_quarantine(
    template: dict[str, Any],
) -> None:
    stmts = statements(template, "WebhookFunction")
    assert {frozenset(actions(s)) for s in stmts} == {
        frozenset({"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"}),
        frozenset({"secretsmanager:GetSecretValue"}),
        frozenset({"sqs:SendMessage"}),
        # registering a waiter (issue 26): its put and the bound's counter, its own table
        frozenset({"dynamodb:PutItem", "dynamodb:UpdateItem"}),
    }
    by_action = {next(iter(sorted(actions(s)))): s["Resource"] for s in stmts}
    assert by_action["dynamodb:GetItem"] == {"Fn::GetAtt": ["OperationsTable", "Arn"]}
    assert by_action["dynamodb:PutItem"] == {"Fn::GetAtt": ["WaitersTable", "Arn"]}
    assert by_action["secretsmanager:GetSecretValue"] == {"Ref": "WebhookSigningSecret"}
    assert by_action["sqs:SendMessage"] == {"Fn::GetAtt": ["WebhookQuarantineQueue", "Arn"]}
    assert len(template["Resources"]["WebhookFunction"]["Properties"]["Policies"]) == 1


def test_signed_webhooks_we_cannot_read_have_a_queue_a_metric_alarm_and_an_output(
    template: dict[str, Any],
) -> None:
    resources = template["Resources"]
    queue = resources["WebhookQuarantineQueue"]
    assert queue["Type"] == "AWS::SQS::Queue"
    assert queue["Properties"]["MaximumMessageSize"] == 1048576  # a 256 KiB body, base64
    assert queue["Properties"]["MessageRetentionPeriod"] == 1209600
    env = resources["WebhookFunction"]["Properties"]["Environment"]["Variables"]
    assert env["OPSTATE_QUARANTINE_QUEUE_URL"] == {"Ref": "WebhookQuarantineQueue"}
    alarm = resources["WebhooksQuarantinedAlarm"]["Properties"]
    assert (alarm["MetricName"], alarm["Threshold"]) == ("WebhooksQuarantined", 0)
    assert alarm["ComparisonOperator"] == "GreaterThanThreshold"
    assert template["Outputs"]["WebhookQuarantineQueueUrl"]["Value"] == {
        "Ref": "WebhookQuarantineQueue"
    }


def test_only_the_webhook_functions_role_may_send_to_the_quarantine(
    template: dict[str, Any],
) -> None:
    """Issue 24: a hand-written message in the quarantine must not be a way in. The queue's
    resource policy denies sqs:SendMessage to every principal but the webhook function's role
    (SAM names the role it generates ``<function>Role``: the function must not bring its own)."""
    resources = template["Resources"]
    assert "Role" not in resources["WebhookFunction"]["Properties"]
    policies = [
        r["Properties"]
        for r in resources.values()
        if r["Type"] == "AWS::SQS::QueuePolicy"
        and {"Ref": "WebhookQuarantineQueue"} in r["Properties"]["Queues"]
    ]
    assert len(policies) == 1
    role = {"Fn::GetAtt": ["WebhookFunctionRole", "Arn"]}
    queue = {"Fn::GetAtt": ["WebhookQuarantineQueue", "Arn"]}
    stmts = policies[0]["PolicyDocument"]["Statement"]
    denies = [s for s in stmts if s["Effect"] == "Deny"]
    assert len(denies) == 1
    (deny,) = denies
    assert deny["Principal"] == "*" and deny["Resource"] == queue
    assert actions(deny) in ({"sqs:SendMessage"}, {"sqs:*"})
    assert deny["Condition"] == {"ArnNotEquals": {"aws:PrincipalArn": role}}
    allows = [s for s in stmts if s["Effect"] == "Allow"]
    assert all(
        s["Principal"] == {"AWS": role} and actions(s) == {"sqs:SendMessage"} for s in allows
    )


def test_reconciler_may_query_the_open_index_and_read_only_its_two_secrets(
    template: dict[str, Any],
) -> None:
    stmts = statements(template, "ReconcileFunction")
    table = next(s for s in stmts if "dynamodb:Query" in actions(s))
    assert actions(table) == {
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:Query",
    }
    assert table["Resource"] == [
        {"Fn::GetAtt": ["OperationsTable", "Arn"]},
        {"Fn::Sub": "${OperationsTable.Arn}/index/open-index"},
        {"Fn::Sub": "${OperationsTable.Arn}/index/archive-index"},
        {"Fn::Sub": "${OperationsTable.Arn}/index/retry-index"},
    ]
    secrets = [s["Resource"] for s in stmts if "secretsmanager:GetSecretValue" in actions(s)]
    # The Gemini API key and the Google Cloud credentials (federation needs no AWS grant).
    assert secrets == [{"Ref": "GeminiApiKeySecret"}, {"Ref": "GoogleCredentialsSecret"}]
    # The archive re-drive (issue 21): find a due archive (archive-index; a Scan of the table
    # once per process for the items written before the index) and invoke the archiver.
    scan = next(s for s in stmts if "dynamodb:Scan" in actions(s))
    assert actions(scan) == {"dynamodb:Scan"}
    assert scan["Resource"] == {"Fn::GetAtt": ["OperationsTable", "Arn"]}
    invoke = next(s for s in stmts if "lambda:InvokeFunction" in actions(s))
    assert invoke["Resource"] == {"Fn::GetAtt": ["ArchiverFunction", "Arn"]}
    assert len(stmts) == 5


def test_archiver_has_its_own_least_privilege_role(template: dict[str, Any]) -> None:
    fn = template["Resources"]["ArchiverFunction"]["Properties"]
    assert len(fn["Policies"]) == 1
    stmts = statements(template, "ArchiverFunction")
    by_sid = {s["Sid"]: s for s in stmts}
    assert set(by_sid) == {
        "ArchiveStatusBesideRecords",
        "DueArchives",
        "ResultsObjects",
        "ResultsListing",
        "GeminiApiKeySecret",
        "RetryChildrenTracked",
        "TrackedInputs",
    }
    table = by_sid["ArchiveStatusBesideRecords"]
    assert actions(table) == {"dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:Scan"}
    assert table["Resource"] == {"Fn::GetAtt": ["OperationsTable", "Arn"]}
    # PutItem only to track the retry batches it creates (ingest's conditional create, issue
    # 33); never a delete. Submitting is the submit function's (issue 38).
    tracked = by_sid["RetryChildrenTracked"]
    assert actions(tracked) == {"dynamodb:PutItem"}
    assert tracked["Resource"] == {"Fn::GetAtt": ["OperationsTable", "Arn"]}
    inputs = by_sid["TrackedInputs"]
    assert actions(inputs) == {"s3:GetObject"}
    assert inputs["Resource"] == {"Fn::Sub": "${ResultsBucket.Arn}/incoming/*"}
    queue = by_sid["DueArchives"]
    assert actions(queue) == {"dynamodb:Query"}
    assert queue["Resource"] == [
        {"Fn::Sub": "${OperationsTable.Arn}/index/archive-index"},
        {"Fn::Sub": "${OperationsTable.Arn}/index/retry-index"},
    ]
    objects = by_sid["ResultsObjects"]
    assert actions(objects) == {
        "s3:PutObject",
        "s3:GetObject",
        "s3:DeleteObject",
        "s3:AbortMultipartUpload",
        "s3:ListMultipartUploadParts",
    }
    assert objects["Resource"] == {"Fn::Sub": "${ResultsBucket.Arn}/results/*"}
    listing = by_sid["ResultsListing"]
    assert actions(listing) == {"s3:ListBucket"}
    assert listing["Condition"] == {"StringLike": {"s3:prefix": "results/*"}}
    assert by_sid["GeminiApiKeySecret"]["Resource"] == {"Ref": "GeminiApiKeySecret"}
    env = fn["Environment"]["Variables"]
    assert env["OPSTATE_RESULTS_URL"] == {"Fn::Sub": "s3://${ResultsBucket}/results"}
    # The retry pass reads an input named over HTTP only under incoming/ (issue 38).
    assert env["OPSTATE_RETRY_INPUT_PREFIXES"] == {"Fn::Sub": "s3://${ResultsBucket}/incoming/"}


def test_the_submit_function_has_its_own_role_concurrency_and_memory(
    template: dict[str, Any],
) -> None:
    """Issue 38, repro 6: submitting is not the archiver's (its role read results/*, and its two
    reserved executions were shared); the submit function reads inputs only under incoming/."""
    resources = template["Resources"]
    fn = resources["SubmitFunction"]["Properties"]
    assert fn["CodeUri"] == {"Fn::If": ["IsArm64", "functions/submit-arm64", "functions/submit"]}
    # One vCPU: the check, copy and split of a large input are CPU bound (docs/jobs.md).
    assert fn["ReservedConcurrentExecutions"] == 2 and fn["MemorySize"] == 1769
    assert "Events" not in fn  # invoked by an operator only
    assert template["Outputs"]["SubmitFunctionName"]["Value"] == {"Ref": "SubmitFunction"}
    env = fn["Environment"]["Variables"]
    assert env["OPSTATE_RESULTS_URL"] == {"Fn::Sub": "s3://${ResultsBucket}/results"}
    by_sid = {s["Sid"]: s for s in statements(template, "SubmitFunction")}
    assert set(by_sid) == {
        "SubmittedTracked",
        "SubmitInputs",
        "KeptInputs",
        "SubmitMarkers",
        "KeptInputsListing",
        "GeminiApiKeySecret",
        "NudgeArchiver",
    }
    # A new job is handed to the archiver at once: it may invoke the archiver, nothing else.
    assert actions(by_sid["NudgeArchiver"]) == {"lambda:InvokeFunction"}
    assert by_sid["NudgeArchiver"]["Resource"] == {"Fn::GetAtt": ["ArchiverFunction", "Arn"]}
    assert env["OPSTATE_ARCHIVER_FUNCTION"] == {"Ref": "ArchiverFunction"}
    reads = [
        s for s in by_sid.values() if actions(s) & {"s3:GetObject", "s3:GetObjectVersion", "s3:*"}
    ]
    read_from = [
        r
        for s in reads
        for r in (s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]])
    ]
    # It reads the input under incoming/, its markers and its own temporary upload; never a
    # kept prompt (results/inputs/<sha256>/input.jsonl, issue 47) nor results/* as a whole.
    assert sorted(map(str, read_from)) == sorted(
        map(
            str,
            [
                {"Fn::Sub": "${ResultsBucket.Arn}/incoming/*"},
                {"Fn::Sub": "${ResultsBucket.Arn}/results/inputs/*/submit-*.json"},
                {"Fn::Sub": "${ResultsBucket.Arn}/results/.incoming/*"},
            ],
        )
    )
    assert "s3:GetObject" not in actions(by_sid["KeptInputs"])
    assert actions(by_sid["SubmitInputs"]) == {"s3:GetObject"}
    assert by_sid["KeptInputsListing"]["Condition"] == {
        "StringLike": {"s3:prefix": "results/inputs/*"}
    }
    table = by_sid["SubmittedTracked"]
    assert actions(table) == {"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"}
    assert table["Resource"] == {"Fn::GetAtt": ["OperationsTable", "Arn"]}
    assert by_sid["GeminiApiKeySecret"]["Resource"] == {"Ref": "GeminiApiKeySecret"}
    reqs = (ROOT / "functions/submit/requirements.txt").read_text(encoding="utf-8")
    assert re.search(r"^google-genai==", reqs, re.M)
    assert (ROOT / "functions/submit/app.py").read_text().count("submit_request") >= 1


def test_the_retry_right_over_the_api_is_off_unless_the_operator_sets_it(
    template: dict[str, Any],
) -> None:
    parameter = template["Parameters"]["RetryOverApi"]
    assert (parameter["Default"], parameter["AllowedValues"]) == ("false", ["true", "false"])
    env = template["Resources"]["WebhookFunction"]["Properties"]["Environment"]["Variables"]
    assert env["OPSTATE_RETRY_OVER_API"] == {"Ref": "RetryOverApi"}
    assert env["OPSTATE_RETRY_INPUT_PREFIXES"] == {"Fn::Sub": "s3://${ResultsBucket}/incoming/"}


def test_archiver_is_triggered_by_terminal_changes_with_bounded_retries_and_a_dlq(
    template: dict[str, Any],
) -> None:
    fn = template["Resources"]["ArchiverFunction"]["Properties"]
    (event,) = fn["Events"].values()
    assert event["Type"] == "EventBridgeRule"
    props = event["Properties"]
    assert props["EventBusName"] == {"Ref": "EventBus"}
    assert props["Pattern"]["detail-type"] == ["Operation State Changed"]
    from opstate.domain.states import State, is_terminal

    assert set(props["Pattern"]["detail"]["state"]) == {str(s) for s in State if is_terminal(s)}
    assert props["RetryPolicy"]["MaximumRetryAttempts"] <= 3
    assert props["DeadLetterConfig"] == {"Arn": {"Fn::GetAtt": ["ArchiverDeadLetterQueue", "Arn"]}}
    invoke = fn["EventInvokeConfig"]
    assert invoke["MaximumRetryAttempts"] <= 2
    assert invoke["DestinationConfig"]["OnFailure"]["Destination"] == {
        "Fn::GetAtt": ["ArchiverDeadLetterQueue", "Arn"]
    }
    alarm = template["Resources"]["ArchiverDeadLetterQueueAlarm"]["Properties"]
    assert alarm["Dimensions"][0]["Value"] == {
        "Fn::GetAtt": ["ArchiverDeadLetterQueue", "QueueName"]
    }
    for name in ("ResultsAtRiskAlarm", "ResultsLostAlarm"):
        assert template["Resources"][name]["Properties"]["Namespace"]


def test_results_bucket_is_private_encrypted_tls_only_expiring_and_kept(
    template: dict[str, Any],
) -> None:
    bucket = template["Resources"]["ResultsBucket"]
    assert bucket["DeletionPolicy"] == bucket["UpdateReplacePolicy"] == "Retain"
    props = bucket["Properties"]
    assert all(props["PublicAccessBlockConfiguration"].values())
    assert len(props["PublicAccessBlockConfiguration"]) == 4
    (rule,) = props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] in ("AES256", "aws:kms")
    rules = {r["Id"]: r for r in props["LifecycleConfiguration"]["Rules"]}
    assert rules["ResultsRetention"]["ExpirationInDays"] == {"Ref": "ResultsRetentionDays"}
    assert rules["ResultsRetention"]["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"] == 1
    assert rules["IncomingUploads"]["Prefix"] == "results/.incoming/"
    (statement,) = template["Resources"]["ResultsBucketPolicy"]["Properties"]["PolicyDocument"][
        "Statement"
    ]
    assert statement["Effect"] == "Deny" and statement["Action"] == "s3:*"
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def test_notifier_may_only_read_its_stream_put_events_on_its_bus_and_dead_letter(
    template: dict[str, Any],
) -> None:
    # Issue 24: an explicit role (SAM's DynamoDB event would add a policy reading every stream
    # in the account); tests/e2e/test_template_roles.py checks the translated role too.
    function = template["Resources"]["NotifyFunction"]["Properties"]
    assert "Policies" not in function
    assert function["Role"] == {"Fn::GetAtt": ["NotifyFunctionRole", "Arn"]}
    role = template["Resources"]["NotifyFunctionRole"]["Properties"]
    (policy,) = role["Policies"]
    resources = {
        frozenset(actions(s)): s["Resource"] for s in policy["PolicyDocument"]["Statement"]
    }
    read = frozenset(
        {"dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator"}
    )
    assert resources == {
        read: {"Fn::GetAtt": ["OperationsTable", "StreamArn"]},
        frozenset({"dynamodb:ListStreams"}): {"Fn::Sub": "${OperationsTable.Arn}/stream/*"},
        frozenset({"events:PutEvents"}): {"Fn::GetAtt": ["EventBus", "Arn"]},
        frozenset({"sqs:SendMessage"}): {"Fn::GetAtt": ["NotifyDeadLetterQueue", "Arn"]},
    }


def test_the_indexes_named_in_the_policies_are_the_tables_gsis(template: dict[str, Any]) -> None:
    from opstate.store.dynamodb import ARCHIVE_INDEX, OPEN_INDEX, RETRY_INDEX

    gsis = template["Resources"]["OperationsTable"]["Properties"]["GlobalSecondaryIndexes"]
    assert [g["IndexName"] for g in gsis] == [OPEN_INDEX, ARCHIVE_INDEX, RETRY_INDEX]
    archive, retry = gsis[1], gsis[2]
    assert archive["KeySchema"] == [
        {"AttributeName": "archive_queue", "KeyType": "HASH"},
        {"AttributeName": "archive_due_ns", "KeyType": "RANGE"},
    ]
    assert retry["KeySchema"] == [
        {"AttributeName": "retry_queue", "KeyType": "HASH"},
        {"AttributeName": "retry_due_ns", "KeyType": "RANGE"},
    ]
    assert retry["Projection"] == {"ProjectionType": "ALL"}
    # The two functions that list due archives and due retry roots may query both indexes.
    for function in ("ReconcileFunction", "ArchiverFunction"):
        statements = template["Resources"][function]["Properties"]["Policies"][0]["Statement"]
        queried = [
            r
            for st in statements
            if "dynamodb:Query"
            in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"])
            for r in ([st["Resource"]] if isinstance(st["Resource"], dict) else st["Resource"])
        ]
        assert {"Fn::Sub": "${OperationsTable.Arn}/index/archive-index"} in queried, function
        assert {"Fn::Sub": "${OperationsTable.Arn}/index/retry-index"} in queried, function


def test_reconciler_schedule_retries_dead_letters_and_never_overlaps(
    template: dict[str, Any],
) -> None:
    props = template["Resources"]["ReconcileFunction"]["Properties"]
    assert props["ReservedConcurrentExecutions"] == 1
    # The run stops starting work 10 s (the default safety margin) before the end.
    assert props["Timeout"] >= 60
    (event,) = props["Events"].values()
    assert event["Type"] == "ScheduleV2"
    schedule = event["Properties"]
    assert schedule["ScheduleExpression"] == {"Fn::Sub": "rate(${ReconcileRateMinutes} minutes)"}
    assert template["Parameters"]["ReconcileRateMinutes"]["Default"] == 5
    assert schedule["DeadLetterConfig"] == {
        "Arn": {"Fn::GetAtt": ["SchedulerDeadLetterQueue", "Arn"]}
    }
    assert 0 < schedule["RetryPolicy"]["MaximumRetryAttempts"] <= 5
    assert schedule["RetryPolicy"]["MaximumEventAgeInSeconds"] <= 3600


def test_notifier_stream_source_is_bounded_and_reports_item_failures(
    template: dict[str, Any],
) -> None:
    (event,) = template["Resources"]["NotifyFunction"]["Properties"]["Events"].values()
    assert event["Type"] == "DynamoDB"
    p = event["Properties"]
    assert p["Stream"] == {"Fn::GetAtt": ["OperationsTable", "StreamArn"]}
    assert p["StartingPosition"] == "TRIM_HORIZON"
    assert 1 <= p["BatchSize"] <= 100
    assert 0 < p["MaximumBatchingWindowInSeconds"] <= 5
    assert p["BisectBatchOnFunctionError"] is True
    assert 0 < p["MaximumRetryAttempts"] <= 10
    assert 60 <= p["MaximumRecordAgeInSeconds"] <= 86400
    assert p["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert p["DestinationConfig"]["OnFailure"] == {
        "Type": "SQS",
        "Destination": {"Fn::GetAtt": ["NotifyDeadLetterQueue", "Arn"]},
    }


def test_routes_webhook_public_operations_iam(template: dict[str, Any]) -> None:
    events = template["Resources"]["WebhookFunction"]["Properties"]["Events"]
    routes = {(e["Properties"]["Method"], e["Properties"]["Path"]): e for e in events.values()}
    assert set(routes) == {
        ("POST", "/gemini/webhook"),
        ("POST", "/google-cloud/pubsub"),
        ("GET", "/operations/{name+}"),
        ("PUT", "/operations/{name+}"),
    }
    assert "Auth" not in routes[("POST", "/gemini/webhook")]["Properties"]
    assert "Auth" not in routes[("POST", "/google-cloud/pubsub")]["Properties"]
    for key in (("GET", "/operations/{name+}"), ("PUT", "/operations/{name+}")):
        assert routes[key]["Properties"]["Auth"] == {"Authorizer": "AWS_IAM"}
    api = template["Resources"]["HttpApi"]["Properties"]
    assert api["Auth"]["EnableIamAuthorizer"] is True
    assert "DefaultAuthorizer" not in api["Auth"]
    assert {"ThrottlingRateLimit", "ThrottlingBurstLimit"} <= set(api["DefaultRouteSettings"])
    assert api["AccessLogSettings"]["DestinationArn"] == {
        "Fn::GetAtt": ["ApiAccessLogGroup", "Arn"]
    }


def test_every_variable_the_template_sets_is_read_by_the_code(template: dict[str, Any]) -> None:
    known = set(re.findall(r'"((?:OPSTATE|GEMINI|POWERTOOLS)_[A-Z_]+)"', _package_source()))
    known |= {"POWERTOOLS_SERVICE_NAME", "POWERTOOLS_METRICS_NAMESPACE", "POWERTOOLS_LOG_LEVEL"}
    # Read by the libraries themselves (declared for `sam local`): boto3 and google-genai.
    known |= {"AWS_ENDPOINT_URL", "GOOGLE_GEMINI_BASE_URL", "GOOGLE_VERTEX_BASE_URL"}
    set_by_template = set(template["Globals"]["Function"]["Environment"]["Variables"])
    for fn in resources(template, "AWS::Serverless::Function").values():
        set_by_template |= set(fn["Properties"].get("Environment", {}).get("Variables", {}))
    assert set_by_template <= known, set_by_template - known


def test_functions_log_json_and_lambdas_own_lines_only_when_asked(
    template: dict[str, Any],
) -> None:
    """Issue 48: Lambda's START/END/REPORT lines (INFO system logs) stay out of the log groups
    unless ``SystemLogLevel=INFO``; the application level follows ``LogLevel`` but never goes
    above INFO, where Lambda files the EMF metric lines (no level key) and would drop them
    (opstate.lambda_logging keeps LogLevel's own level; tests/e2e/test_built_logging.py runs it)."""
    logging_config = template["Globals"]["Function"]["LoggingConfig"]
    assert logging_config == {
        "LogFormat": "JSON",
        "ApplicationLogLevel": {"Fn::FindInMap": ["LogLevels", {"Ref": "LogLevel"}, "Application"]},
        "SystemLogLevel": {"Ref": "SystemLogLevel"},
    }
    system = template["Parameters"]["SystemLogLevel"]
    assert (system["Default"], system["AllowedValues"]) == ("WARN", ["WARN", "INFO"])
    levels = template["Mappings"]["LogLevels"]
    assert list(levels) == template["Parameters"]["LogLevel"]["AllowedValues"]
    assert {level: row["Application"] for level, row in levels.items()} == {
        "DEBUG": "DEBUG",
        "INFO": "INFO",
        "WARNING": "INFO",
        "ERROR": "INFO",
    }
    for name, fn in resources(template, "AWS::Serverless::Function").items():
        assert "LoggingConfig" not in fn["Properties"], name  # every function takes Globals'


def _package_source() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(PACKAGE.rglob("*.py")))


def test_the_resumer_may_read_records_move_waiters_and_answer_only_the_allowed_tasks(
    template: dict[str, Any],
) -> None:
    # Issue 24's rule: an explicit role (SAM's DynamoDB events would add a policy reading every
    # stream in the account); tests/e2e/test_template_roles.py checks the translated role too.
    function = template["Resources"]["WaiterResumerFunction"]["Properties"]
    assert "Policies" not in function
    assert function["Role"] == {"Fn::GetAtt": ["WaiterResumerFunctionRole", "Arn"]}
    (policy,) = template["Resources"]["WaiterResumerFunctionRole"]["Properties"]["Policies"]
    # As deployed by an operator who named both kinds' ARNs (issue 31: with the defaults the
    # two resume statements are absent; tests/e2e/test_template_waiters.py).
    named = {"WaiterStateMachineArns": "arn:aws:states:::x", "WaiterDurableFunctionArns": "*"}
    stmts = {s["Sid"]: s for s in decided(policy["PolicyDocument"]["Statement"], template, named)}
    assert {sid: actions(s) for sid, s in stmts.items()} == {
        "ConsumedStreamsRead": {
            "dynamodb:DescribeStream",
            "dynamodb:GetRecords",
            "dynamodb:GetShardIterator",
        },
        "ConsumedStreamsList": {"dynamodb:ListStreams"},
        "OperationsTableRead": {"dynamodb:GetItem"},
        "WaitersTableResume": {"dynamodb:Query", "dynamodb:DeleteItem", "dynamodb:UpdateItem"},
        "ResumeStepFunctionsTasks": {"states:SendTaskSuccess", "states:SendTaskFailure"},
        "ResumeDurableCallbacks": {
            "lambda:SendDurableExecutionCallbackSuccess",
            "lambda:SendDurableExecutionCallbackFailure",
        },
        "WaiterDeadLetterSend": {"sqs:SendMessage"},
    }
    assert stmts["ConsumedStreamsRead"]["Resource"] == [
        {"Fn::GetAtt": ["WaitersTable", "StreamArn"]},
        {"Fn::GetAtt": ["OperationsTable", "StreamArn"]},
    ]
    assert stmts["ConsumedStreamsList"]["Resource"] == [
        {"Fn::Sub": "${WaitersTable.Arn}/stream/*"},
        {"Fn::Sub": "${OperationsTable.Arn}/stream/*"},
    ]
    assert stmts["OperationsTableRead"]["Resource"] == {"Fn::GetAtt": ["OperationsTable", "Arn"]}
    assert stmts["WaitersTableResume"]["Resource"] == {"Fn::GetAtt": ["WaitersTable", "Arn"]}
    assert stmts["WaiterDeadLetterSend"]["Resource"] == {
        "Fn::GetAtt": ["WaiterDeadLetterQueue", "Arn"]
    }
    assert stmts["ResumeStepFunctionsTasks"]["Resource"] == {"Ref": "WaiterStateMachineArns"}
    assert stmts["ResumeDurableCallbacks"]["Resource"] == {"Ref": "WaiterDurableFunctionArns"}
    props = template["Resources"]["WaiterResumerFunction"]["Properties"]
    bus, stream = props["Events"]["OperationEvents"], props["Events"]["WaiterRegistered"]
    assert bus["Properties"]["Pattern"]["detail-type"] == [
        "Operation State Changed",
        "Operation Lost",
        "Operation Results Archived",
        "Operation Results Lost",
        "Operation Results Final",
    ]
    assert stream["Properties"]["Stream"] == {"Fn::GetAtt": ["WaitersTable", "StreamArn"]}
    dlq = {"Fn::GetAtt": ["WaiterDeadLetterQueue", "Arn"]}
    assert stream["Properties"]["DestinationConfig"]["OnFailure"]["Destination"] == dlq
    assert bus["Properties"]["DeadLetterConfig"]["Arn"] == dlq
    assert props["EventInvokeConfig"]["DestinationConfig"]["OnFailure"]["Destination"] == dlq


def test_alarms_watch_metrics_the_code_emits(template: dict[str, Any]) -> None:
    alarms = resources(template, "AWS::CloudWatch::Alarm")
    custom = {
        a["Properties"]["MetricName"]
        for a in alarms.values()
        if a["Properties"].get("Namespace")
        == {"Fn::FindInMap": ["Observability", "Metrics", "Namespace"]}
    }
    assert {
        "IngestGaveUp",
        "SignatureRejected",
        "WebhooksDisabled",
        "OldestOpenAgeSeconds",
    } <= custom
    source = _package_source()
    # OldestOpenAgeSeconds is the reconciler's to publish (docs/deploy.md); the others exist.
    for metric in custom - {"OldestOpenAgeSeconds"}:
        assert f'"{metric}"' in source, f"no code emits {metric}"
    queues = {
        a["Properties"]["Dimensions"][0]["Value"]["Fn::GetAtt"][0]
        for a in alarms.values()
        if a["Properties"].get("Namespace") == "AWS/SQS"
    }
    assert queues == {
        "NotifyDeadLetterQueue",
        "SchedulerDeadLetterQueue",
        "ArchiverDeadLetterQueue",
        "WaiterDeadLetterQueue",
    }
    assert any(
        a["Properties"].get("Namespace") is None
        and any(
            m.get("MetricStat", {}).get("Metric", {}).get("MetricName") == "5xx"
            for m in a["Properties"]["Metrics"]
        )
        for a in alarms.values()
    )
    for alarm in alarms.values():
        assert alarm["Properties"]["AlarmActions"] == {
            "Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]
        }


def test_state_resources_are_encrypted_and_kept(template: dict[str, Any]) -> None:
    table = template["Resources"]["OperationsTable"]
    assert table["DeletionPolicy"] == table["UpdateReplacePolicy"] == "Retain"
    props = table["Properties"]
    assert props["BillingMode"] == "PAY_PER_REQUEST"
    # The AWS-managed key, or the customer-managed KmsKeyArn when one is given (issue 24).
    assert props["SSESpecification"] == {
        "SSEEnabled": True,
        "SSEType": {"Fn::If": ["HasKmsKey", "KMS", {"Ref": "AWS::NoValue"}]},
        "KMSMasterKeyId": {"Fn::If": ["HasKmsKey", {"Ref": "KmsKeyArn"}, {"Ref": "AWS::NoValue"}]},
    }
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert props["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
    assert props["StreamSpecification"] == {"StreamViewType": "NEW_AND_OLD_IMAGES"}
    # The queues an EventBridge rule dead-letters into (the archiver's, the resumer's): SSE-SQS,
    # since EventBridge cannot write under the AWS-managed aws/sqs key (tests/e2e/
    # test_template_scan.py); every other queue SSE-KMS with that key (CKV_AWS_27; issue 24).
    bus_dlqs = {"ArchiverDeadLetterQueue", "WaiterDeadLetterQueue"}
    for name, queue in resources(template, "AWS::SQS::Queue").items():
        if name in bus_dlqs:
            assert queue["Properties"]["SqsManagedSseEnabled"] is True, name
            continue
        assert queue["Properties"]["KmsMasterKeyId"] == "alias/aws/sqs", name
        assert "SqsManagedSseEnabled" not in queue["Properties"], name
    secrets = resources(template, "AWS::SecretsManager::Secret")
    assert set(secrets) == {"WebhookSigningSecret", "GeminiApiKeySecret", "GoogleCredentialsSecret"}
    for secret in secrets.values():
        # Created empty: no value ever passes through CloudFormation.
        assert not {"SecretString", "GenerateSecretString"} & set(secret["Properties"])


def test_layer_and_dependencies_are_where_the_design_says(template: dict[str, Any]) -> None:
    layer = template["Resources"]["OpstateLayer"]
    # One code directory per architecture (sam build tells a makefile nothing else).
    assert layer["Properties"]["ContentUri"] == {
        "Fn::If": ["IsArm64", "layers/opstate-arm64", "layers/opstate"]
    }
    assert template["Resources"]["ReconcileFunction"]["Properties"]["CodeUri"] == {
        "Fn::If": ["IsArm64", "functions/reconcile-arm64", "functions/reconcile"]
    }
    assert template["Conditions"]["IsArm64"] == {"Fn::Equals": [{"Ref": "Architecture"}, "arm64"]}
    architecture = template["Parameters"]["Architecture"]
    assert (architecture["Default"], architecture["AllowedValues"]) == (
        "x86_64",
        ["x86_64", "arm64"],
    )
    assert template["Globals"]["Function"]["Architectures"] == [{"Ref": "Architecture"}]
    assert layer["Properties"]["CompatibleArchitectures"] == [{"Ref": "Architecture"}]
    for resource in template["Resources"].values():  # no function pins its own architecture
        if resource["Type"] == "AWS::Serverless::Function":
            assert "Architectures" not in resource["Properties"]
    # layers/opstate/Makefile: pip install of the pins + opstate, compiled for python3.13.
    assert layer["Metadata"]["BuildMethod"] == "makefile"
    assert template["Globals"]["Function"]["Runtime"] == "python3.13"
    assert template["Globals"]["Function"]["Tracing"] == "Active"
    layer_reqs = (ROOT / "layers/opstate/requirements.txt").read_text(encoding="utf-8").lower()
    assert "google-genai" not in layer_reqs
    # Powertools' Tracer imports the X-Ray SDK on construction (Tracing: Active).
    assert re.search(r"^aws-xray-sdk==", layer_reqs, re.M)
    assert re.search(r"^aws-lambda-powertools==", layer_reqs, re.M)
    reconcile_reqs = (ROOT / "functions/reconcile/requirements.txt").read_text(encoding="utf-8")
    assert re.search(r"^google-genai==", reconcile_reqs, re.M)
    for fn in ("webhook", "notify"):
        reqs = ROOT / "functions" / fn / "requirements.txt"
        assert not reqs.exists() or "google-genai" not in reqs.read_text(encoding="utf-8")


def test_outputs(template: dict[str, Any]) -> None:
    assert {
        "WebhookUrl",
        "OperationsApiUrl",
        "TableName",
        "EventBusName",
        "WebhookSigningSecretArn",
        "GeminiApiKeySecretArn",
    } <= set(template["Outputs"])
    assert template["Outputs"]["WebhookUrl"]["Value"]["Fn::Sub"].endswith("/gemini/webhook")


def test_overdue_and_lost_alarms_watch_the_reconciler_metrics(template: dict[str, Any]) -> None:
    resources = template["Resources"]
    for alarm, metric in (
        ("OperationsOverdueAlarm", "OperationsOverdue"),
        ("OperationsLostAlarm", "OperationsLost"),
    ):
        props = resources[alarm]["Properties"]
        assert props["MetricName"] == metric
        assert props["Statistic"] == "Sum" and props["Threshold"] == 1
    env = resources["ReconcileFunction"]["Properties"]["Environment"]["Variables"]
    assert env["OPSTATE_RECONCILE_MAX_RPS"] == {"Ref": "ReconcileMaxRps"}
    assert env["OPSTATE_RECONCILE_OVERDUE_HOURS"] == {"Ref": "OverdueHours"}


def test_open_index_key_schema_is_unchanged_so_the_stack_updates_in_place(
    template: dict[str, Any],
) -> None:
    props = template["Resources"]["OperationsTable"]["Properties"]
    # The first index, unchanged; the others added one per release (CloudFormation adds one GSI
    # per update).
    index, _archive, _retry = props["GlobalSecondaryIndexes"]
    assert index["IndexName"] == "open-index"
    assert index["KeySchema"] == [
        {"AttributeName": "open_shard", "KeyType": "HASH"},
        {"AttributeName": "open_update_ns", "KeyType": "RANGE"},
    ]
