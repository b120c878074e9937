#!/usr/bin/env python3
"""Project contract checks on the SAM-transformed template (JSON).

cfn-lint and checkov know CloudFormation; they do not know what the sas code and the
infra/ bootstrap expect. This checks that contract:

- resource names (with Prefix = sas), keys, the sparse due-index and error-index GSIs and
  TTL on expires_at;
- every work queue (orders, scheduler, agent, callbacks) redrives to its DLQ after 5
  receives, with visibility >= 6x the timeout of the function consuming it + its batching
  window (each allowed value); SQS event sources report batch item failures; the scheduler
  consumes its own queue and the callback queue, nothing else does;
- queue policies: every queue refuses requests without TLS, and the only thing any queue
  policy allows is sqs:SendMessage on the callback queue to CallbackSenderArns;
- the four functions: provided.al2023, arm64, JSON logs, the environment the code reads;
- IAM: one role per function, no managed policies, no wildcard action or resource
  (except the log-stream part of the function's own log group), and exactly the
  (action, resource) pairs each function needs -- no more, no less (the agent's one write,
  PutItem, only on call# keys; its secrets only on the deployer's AgentSecretArns; every kms action only through the service that
  uses the key, kms:ViaService: SSM or Secrets Manager for the secrets, SNS for the topic);
  the optional callback endpoint's role (API Gateway) may only send to the callback queue,
  and its integration sends there with that role;
- the functions' one layer (the definition file) is a layer of the stack's own account;
- alarms: OrdersFailed, depth on every DLQ, Errors and Throttles per function, supervisor
  not running (missing data breaching), StaleReplies, CallbacksTimedOut, SweepsCutShort; all notify the
  operator topic;
- the dashboard body is valid JSON once substituted and shows every alarm;
- outputs carry queue URLs, table names and the topic ARN.

Usage: check-template-contract.py template.transformed.json variables.json  (exit 1 on any finding)
(variables.json: `sas-bootstrap --variables --json`, the code's list of the functions' variables)
"""

import json
import os
import re
import sys

PREFIX = "sas"
PARAM_DEFAULTS = {"Prefix": PREFIX}

errors = []


def err(msg):
    errors.append(msg)


def sub_name(value):
    """Resolve a name given as a literal or Fn::Sub of ${Prefix}."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Sub" in value and isinstance(value["Fn::Sub"], str):
        return re.sub(r"\$\{(\w+)\}", lambda m: PARAM_DEFAULTS.get(m.group(1), m.group(0)), value["Fn::Sub"])
    return None


def ref_target(value):
    """The logical id an intrinsic points at (Ref, GetAtt, or Sub of one resource)."""
    if isinstance(value, dict):
        if "Ref" in value:
            return value["Ref"]
        if "Fn::GetAtt" in value:
            att = value["Fn::GetAtt"]
            return att[0] if isinstance(att, list) else att.split(".")[0]
        if "Fn::Sub" in value:
            text = value["Fn::Sub"] if isinstance(value["Fn::Sub"], str) else value["Fn::Sub"][0]
            if re.fullmatch(r"\$\{(\w+)\.Arn\}/index/[\w-]+", text):
                return text.replace("${", "").replace(".Arn}", "")  # StateTable/index/due-index
            m = re.fullmatch(r"arn:\$\{AWS::Partition\}:logs:.*:log-group:\$\{(\w+)\}:log-stream:\*", text)
            if m:
                return m.group(1) + ":log-stream:*"
    return json.dumps(value, sort_keys=True)


def as_list(value):
    return value if isinstance(value, list) else [value]


t = json.load(open(sys.argv[1], encoding="utf-8"))
R = t["Resources"]


def of_type(kind):
    return {k: v for k, v in R.items() if v["Type"] == kind}


# ---------------------------------------------------------------- tables
tables = {sub_name(v["Properties"].get("TableName")): (k, v["Properties"]) for k, v in of_type("AWS::DynamoDB::Table").items()}
if sorted(tables) != [f"{PREFIX}-state"]:
    err(f"tables: one state table expected, the order lives in its item (have {sorted(tables)})")
for name in (f"{PREFIX}-state",):
    if name not in tables:
        err(f"table {name} missing (have {sorted(tables)})")
        continue
    _, p = tables[name]
    if p.get("KeySchema") != [{"AttributeName": "order_id", "KeyType": "HASH"}]:
        err(f"{name}: key must be order_id (HASH)")
    if {"AttributeName": "order_id", "AttributeType": "S"} not in p.get("AttributeDefinitions", []):
        err(f"{name}: order_id must be S")
    if p.get("BillingMode") != "PAY_PER_REQUEST":
        err(f"{name}: BillingMode must be PAY_PER_REQUEST")
    if not p.get("SSESpecification", {}).get("SSEEnabled"):
        err(f"{name}: SSE not enabled")
    if not p.get("PointInTimeRecoverySpecification", {}).get("PointInTimeRecoveryEnabled"):
        err(f"{name}: PITR not enabled")
    if p.get("DeletionProtectionEnabled") != {"Ref": "DeletionProtection"}:
        err(f"{name}: DeletionProtectionEnabled must be the DeletionProtection parameter")
if f"{PREFIX}-state" in tables:
    _, p = tables[f"{PREFIX}-state"]
    # An element under a condition (Fn::If [cond, element, AWS::NoValue]) is checked as
    # the element it is when the condition holds.
    def when_on(items):
        return [i["Fn::If"][1] if isinstance(i, dict) and "Fn::If" in i else i for i in items]
    p = dict(p)
    p["AttributeDefinitions"] = when_on(p.get("AttributeDefinitions", []))
    gsis = {g["IndexName"]: g for g in when_on(p.get("GlobalSecondaryIndexes", []))}
    g = gsis.get("finished-index")
    if g:
        if g["KeySchema"] != [{"AttributeName": "finished_shard", "KeyType": "HASH"}, {"AttributeName": "updated_at", "KeyType": "RANGE"}]:
            err("finished-index: keys must be finished_shard (HASH), updated_at (RANGE)")
        # One write unit per finished order: the listing reads the tasks it shows.
        if g.get("Projection", {}).get("ProjectionType") != "KEYS_ONLY":
            err("finished-index: projection must be KEYS_ONLY")
        attrs = {a["AttributeName"]: a["AttributeType"] for a in p["AttributeDefinitions"]}
        if attrs.get("finished_shard") != "S":
            err("finished-index: finished_shard must be S")
    g = gsis.get("due-index")
    if not g:
        err("state table: GSI due-index missing")
    else:
        if g["KeySchema"] != [{"AttributeName": "due_shard", "KeyType": "HASH"}, {"AttributeName": "deadline", "KeyType": "RANGE"}]:
            err("due-index: keys must be due_shard (HASH), deadline (RANGE)")
        # The supervisor re-reads every task it acts on; KEYS_ONLY keeps writes that do
        # not move the deadline from costing the index a write.
        if g.get("Projection", {}).get("ProjectionType") != "KEYS_ONLY":
            err("due-index: projection must be KEYS_ONLY")
        attrs = {a["AttributeName"]: a["AttributeType"] for a in p["AttributeDefinitions"]}
        if attrs.get("due_shard") != "S" or attrs.get("deadline") != "N":
            err("due-index: due_shard must be S and deadline N")
    g = gsis.get("error-index")
    if not g:
        err("state table: GSI error-index missing")
    else:
        if g["KeySchema"] != [{"AttributeName": "error_shard", "KeyType": "HASH"}, {"AttributeName": "updated_at", "KeyType": "RANGE"}]:
            err("error-index: keys must be error_shard (HASH), updated_at (RANGE)")
        # Operators list Error tasks from the index alone, with no read per task.
        if g.get("Projection", {}).get("ProjectionType") != "ALL":
            err("error-index: projection must be ALL")
        attrs = {a["AttributeName"]: a["AttributeType"] for a in p["AttributeDefinitions"]}
        if attrs.get("error_shard") != "S" or attrs.get("updated_at") != "N":
            err("error-index: error_shard must be S and updated_at N")
    if p.get("TimeToLiveSpecification") != {"AttributeName": "expires_at", "Enabled": True}:
        err("state table: TTL must be enabled on expires_at (the code writes it on finished tasks)")

# ---------------------------------------------------------------- queues
queues = {sub_name(v["Properties"].get("QueueName")): (k, v["Properties"]) for k, v in of_type("AWS::SQS::Queue").items()}
qid = {name: k for name, (k, _) in queues.items()}
WORK_QUEUES = ("orders", "scheduler", "agent", "callbacks")
expected_queues = [f"{PREFIX}-{q}" for q in WORK_QUEUES]
for name in expected_queues + [f"{PREFIX}-{q}-dlq" for q in WORK_QUEUES] + [f"{PREFIX}-status"]:
    if name not in queues:
        err(f"queue {name} missing (have {sorted(queues)})")
for name in expected_queues:
    if name not in queues:
        continue
    _, p = queues[name]
    rp = p.get("RedrivePolicy", {})
    if ref_target(rp.get("deadLetterTargetArn")) != qid.get(name + "-dlq"):
        err(f"{name}: must redrive to {name}-dlq")
    if rp.get("maxReceiveCount") != 5:
        err(f"{name}: maxReceiveCount must be 5")

# ---------------------------------------------------------------- functions
# What each function reads, from the code's own list; "platform" variables (the region,
# a local endpoint) are Lambda's or a local run's, never the template's.
with open(sys.argv[2]) as f:
    VARIABLES = json.load(f)
if not VARIABLES:
    err("the variable list is empty")
ENV_BY_FUNCTION = {
    short: {v["name"] for v in VARIABLES if short in v["read_by"] and v["source"] != "platform"}
    for short in ("submission", "scheduler", "agent", "supervisor")
}
functions = {sub_name(v["Properties"].get("FunctionName")): (k, v["Properties"]) for k, v in of_type("AWS::Lambda::Function").items()}
fid = {}
for short in ("submission", "scheduler", "agent", "supervisor"):
    name = f"{PREFIX}-{short}"
    if name not in functions:
        err(f"function {name} missing (have {sorted(functions)})")
        continue
    k, p = functions[name]
    fid[short] = k
    if p.get("Runtime") != "provided.al2023":
        err(f"{name}: runtime must be provided.al2023")
    if p.get("Architectures") != ["arm64"]:
        err(f"{name}: architecture must be arm64")
    if p.get("Handler") != "bootstrap":
        err(f"{name}: handler must be bootstrap")
    if p.get("LoggingConfig", {}).get("LogFormat") != "JSON":
        err(f"{name}: LoggingConfig.LogFormat must be JSON")
    env = set(p.get("Environment", {}).get("Variables", {}))
    want = ENV_BY_FUNCTION[short]
    if want - env:
        err(f"{name}: environment lacks {sorted(want - env)}")
    unread = env - {v["name"] for v in VARIABLES}
    if unread:
        err(f"{name}: environment sets {sorted(unread)}, which no function reads")
    # The definition file decides where orders and secrets go: its layer's ARN is built in
    # this account, never taken whole from a parameter.
    layers = json.dumps(p.get("Layers", []))
    if p.get("Layers") and ("${AWS::AccountId}" not in layers or '"Ref": "Workflows' in layers):
        err(f"{name}: Layers must be built as arn:...:${{AWS::AccountId}}:layer:..., not taken from a parameter: {layers}")
    meta = R[k].get("Metadata", {})
    if meta.get("BuildMethod") != "rust-cargolambda" or meta.get("BuildProperties", {}).get("Binary") != short:
        err(f"{name}: Metadata must be BuildMethod rust-cargolambda, Binary {short}")

def visibility_by_window(vis, window, qname):
    """(window, visibility) pairs a queue can be deployed with."""
    if isinstance(window, int) and isinstance(vis, int):
        return [(window, vis)]
    param = window.get("Ref") if isinstance(window, dict) else None
    fim = vis.get("Fn::FindInMap") if isinstance(vis, dict) else None
    if not param or not fim or fim[1] != {"Ref": param}:
        err(f"{qname}: visibility {vis} is not keyed by its batching window parameter {window}")
        return []
    allowed = t.get("Parameters", {}).get(param, {}).get("AllowedValues")
    if not allowed:
        err(f"{param}: a batching window parameter needs AllowedValues (the visibility mapping's keys)")
        return []
    table = t.get("Mappings", {}).get(fim[0], {})
    pairs = []
    for w in allowed:
        entry = table.get(str(w), {}).get(fim[2])
        if not isinstance(entry, int):
            err(f"{qname}: no {fim[0]} entry for window {w} ({fim[2]})")
            continue
        pairs.append((int(w), entry))
    return pairs


# event sources: which queues drive which function (the scheduler: its own queue, and the
# callback queue, whose records it tells apart by their eventSourceARN)
consumer = {
    "submission": [f"{PREFIX}-orders"],
    "scheduler": [f"{PREFIX}-scheduler", f"{PREFIX}-callbacks"],
    "agent": [f"{PREFIX}-agent"],
}
esms = of_type("AWS::Lambda::EventSourceMapping")
seen = set()
for k, v in esms.items():
    p = v["Properties"]
    fn = ref_target(p["FunctionName"])
    q = ref_target(p["EventSourceArn"])
    short = next((s for s, f in fid.items() if f == fn), None)
    qname = next((n for n, i in qid.items() if i == q), None)
    if short not in consumer or qname not in consumer[short]:
        err(f"event source {k}: {short} must consume {consumer.get(short)}, not {qname}")
        continue
    seen.add((short, qname))
    if p.get("FunctionResponseTypes") != ["ReportBatchItemFailures"]:
        err(f"event source {k}: FunctionResponseTypes must be [ReportBatchItemFailures]")
    if p.get("BatchSize") != 10:
        err(f"event source {k}: BatchSize must be 10")
    window = p.get("MaximumBatchingWindowInSeconds")
    if window is None:
        err(f"event source {k}: MaximumBatchingWindowInSeconds missing")
    timeout = functions[f"{PREFIX}-{short}"][1].get("Timeout")
    vis = queues[qname][1].get("VisibilityTimeout", 30)
    # visibility >= 6 x timeout + window, for every window the parameter allows: a literal,
    # or a VisibilityTimeout mapping entry keyed by the same window parameter.
    for w, v in visibility_by_window(vis, window, qname):
        if not isinstance(timeout, int) or v < 6 * timeout + w:
            err(f"{qname}: visibility {v} s < 6 x {short} timeout {timeout} s + window {w} s")
for short, names in consumer.items():
    for qname in names:
        if (short, qname) not in seen:
            err(f"{short}: no SQS event source on {qname}")
rules = of_type("AWS::Events::Rule")
if not any(ref_target(tg["Arn"]) == fid.get("supervisor") for r in rules.values() for tg in r["Properties"].get("Targets", [])):
    err("supervisor: no EventBridge schedule")
if not any(r["Properties"].get("ScheduleExpression") == {"Ref": "SupervisorSchedule"} for r in rules.values()):
    err("supervisor schedule must be the SupervisorSchedule parameter")

def statements(doc):
    """A policy's statements, both branches of a conditional one (Fn::If) included."""
    for st in as_list(doc.get("Statement", [])):
        if isinstance(st, dict) and "Fn::If" in st:
            for branch in st["Fn::If"][1:]:
                if isinstance(branch, dict) and "Ref" not in branch:
                    yield branch
        else:
            yield st


# ---------------------------------------------------------------- queue policies
# Every queue refuses plain http; the one thing a queue policy grants is SendMessage on the
# callback queue to the deployer's CallbackSenderArns (outside systems completing callback
# steps: they can write no Schedule, agent reply or order).
tls_only = set()
for k, v in of_type("AWS::SQS::QueuePolicy").items():
    p = v["Properties"]
    for st in statements(p["PolicyDocument"]):
        resources = {ref_target(r) for r in as_list(st.get("Resource"))}
        if st.get("Effect") == "Deny":
            if st.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}} and st.get("Action") == "sqs:*":
                tls_only |= resources
            continue
        allowed = (
            as_list(st.get("Action")) == ["sqs:SendMessage"]
            and resources == {"CallbackQueue"}
            and st.get("Principal") == {"AWS": {"Ref": "CallbackSenderArns"}}
            and not st.get("Condition")
        )
        if not allowed:
            err(f"queue policy {k}: grants more than SendMessage on the callback queue to CallbackSenderArns: {st}")
for name, (k, _) in queues.items():
    if k not in tls_only:
        err(f"queue {name}: no policy refuses it without TLS")

# ---------------------------------------------------------------- IAM
S = "StatusQueue"
EXTRA = '{"Ref": "ExtraReplyToQueueArns"}'
QUEUE_AGENTS = '{"Ref": "AgentQueueArns"}'
SECRETS = '{"Ref": "AgentSecretArns"}'
# What the SQS event source mapping polls with (Lambda docs); the code itself never
# receives, deletes or changes visibility in Lambda, so ChangeMessageVisibility is not granted.
SQS_CONSUME = ("sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes")


def consume(queue):
    return {(a, queue) for a in SQS_CONSUME}


def logs(group):
    return {("logs:CreateLogStream", group + ":log-stream:*"), ("logs:PutLogEvents", group + ":log-stream:*")}


EXPECTED = {
    "submission": logs("SubmissionLogGroup") | consume("OrdersQueue") | {
        ("dynamodb:PutItem", "StateTable"), ("dynamodb:GetItem", "StateTable"),
        ("sqs:SendMessage", "SchedulerQueue"), ("sqs:SendMessage", "OrdersDlq"), ("sqs:SendMessage", S),
        ("sqs:SendMessage", EXTRA),
    },
    "scheduler": logs("SchedulerLogGroup") | consume("SchedulerQueue") | consume("CallbackQueue") | {
        ("dynamodb:GetItem", "StateTable"), ("dynamodb:PutItem", "StateTable"), ("sqs:SendMessage", "CallbackDlq"),
        ("sqs:SendMessage", "AgentQueue"), ("sqs:SendMessage", "SchedulerQueue"), ("sqs:SendMessage", "SchedulerDlq"),
        ("sqs:SendMessage", S), ("sqs:SendMessage", EXTRA), ("sns:Publish", "AlertTopic"),
        ("kms:GenerateDataKey", "AlertTopicKey"), ("kms:Decrypt", "AlertTopicKey"),
        ("sqs:SendMessage", QUEUE_AGENTS),
    },
    "agent": logs("AgentLogGroup") | consume("AgentQueue") | {
        ("dynamodb:PutItem", "StateTable"),
        ("sqs:SendMessage", "SchedulerQueue"), ("sqs:SendMessage", "AgentDlq"),
        ("ssm:GetParameter", SECRETS), ("secretsmanager:GetSecretValue", SECRETS), ("kms:Decrypt", SECRETS),
    },
    "supervisor": logs("SupervisorLogGroup") | {
        ("dynamodb:Query", "StateTable/index/due-index"), ("dynamodb:GetItem", "StateTable"),
        ("dynamodb:PutItem", "StateTable"),
        ("sqs:SendMessage", "SchedulerQueue"), ("sqs:SendMessage", S), ("sqs:SendMessage", EXTRA),
        ("sns:Publish", "AlertTopic"),
        ("kms:GenerateDataKey", "AlertTopicKey"), ("kms:Decrypt", "AlertTopicKey"),
    },
}


roles_used = {}
for short, k in fid.items():
    role = ref_target(functions[f"{PREFIX}-{short}"][1].get("Role"))
    if role in roles_used.values():
        err(f"{short}: shares role {role} with another function")
    roles_used[short] = role
    rp = R.get(role, {}).get("Properties", {})
    if R.get(role, {}).get("Type") != "AWS::IAM::Role":
        err(f"{short}: role {role} is not a role in this template")
        continue
    if rp.get("ManagedPolicyArns"):
        err(f"{short}: role has managed policies {rp['ManagedPolicyArns']}")
    grants = set()
    for pol in rp.get("Policies", []):
        for st in statements(pol["PolicyDocument"]):
            if st.get("Effect") != "Allow" or "NotAction" in st or "NotResource" in st:
                err(f"{short}: unexpected statement shape {st}")
                continue
            for action in as_list(st["Action"]):
                if "*" in action:
                    err(f"{short}: wildcard action {action}")
                resources = st["Resource"]
                if resources == {"Ref": "ExtraReplyToQueueArns"}:
                    grants.add((action, EXTRA))
                    continue
                if resources == {"Ref": "AgentQueueArns"}:
                    grants.add((action, QUEUE_AGENTS))
                    continue
                # A key is used only through the service that holds what it encrypts.
                conditions = st.get("Condition", {})
                via = {**conditions.get("StringEquals", {}), **conditions.get("StringLike", {})}
                if action.startswith("kms:") and "kms:ViaService" not in via:
                    err(f"{short}: {action} without a kms:ViaService condition")
                # The agent writes only limited agents' call marks: call# keys, no task or gate.
                if short == "agent" and action.startswith("dynamodb:"):
                    leading = conditions.get("ForAllValues:StringLike", {}).get("dynamodb:LeadingKeys")
                    if as_list(leading) != ["call#*"] or set(conditions) != {"ForAllValues:StringLike"}:
                        err(f"{short}: {action} must be limited to call# keys (ForAllValues:StringLike dynamodb:LeadingKeys), not {conditions}")
                if resources == {"Ref": "AgentSecretArns"}:
                    grants.add((action, SECRETS))
                    continue
                for res in as_list(resources):
                    if res == "*" or (isinstance(res, str) and "*" in res):
                        err(f"{short}: wildcard resource {res}")
                    grants.add((action, ref_target(res)))
    if grants != EXPECTED[short]:
        for extra in sorted(grants - EXPECTED[short]):
            err(f"{short}: grant not in the contract: {extra}")
        for missing in sorted(EXPECTED[short] - grants):
            err(f"{short}: grant missing: {missing}")
# The optional callback endpoint's role: API Gateway's, sending to the callback queue only.
# SSE-SQS (SQS-owned keys) needs no kms grant; a kms grant would mean the queue changed.
API_ROLE = "CallbackApiRole"
API_EXPECTED = {("sqs:SendMessage", "CallbackQueue")}
if API_ROLE in R:
    rp = R[API_ROLE]["Properties"]
    trust = [st.get("Principal") for st in as_list(rp["AssumeRolePolicyDocument"]["Statement"])]
    if trust != [{"Service": "apigateway.amazonaws.com"}]:
        err(f"{API_ROLE}: only API Gateway may assume it (trust: {trust})")
    if rp.get("ManagedPolicyArns"):
        err(f"{API_ROLE}: managed policies {rp['ManagedPolicyArns']}")
    grants = set()
    for pol in rp.get("Policies", []):
        for st in statements(pol["PolicyDocument"]):
            if st.get("Effect") != "Allow" or "NotAction" in st or "NotResource" in st or st.get("Condition"):
                err(f"{API_ROLE}: unexpected statement shape {st}")
            for action in as_list(st["Action"]):
                for res in as_list(st["Resource"]):
                    grants.add((action, ref_target(res)))
    if grants != API_EXPECTED:
        err(f"{API_ROLE}: grants {sorted(grants)}, the contract is {sorted(API_EXPECTED)}")
    roles_used["callback-api"] = API_ROLE
    # The endpoint's one method sends to the callback queue with that role, and nothing else.
    methods = of_type("AWS::ApiGateway::Method")
    if len(methods) != 1:
        err(f"callback endpoint: one method expected, have {sorted(methods)}")
    for k, v in methods.items():
        integration = v["Properties"].get("Integration", {})
        uri = json.dumps(integration.get("Uri"))
        if integration.get("Type") != "AWS" or ":sqs:path/" not in uri or "CallbackQueue.QueueName" not in uri:
            err(f"{k}: must integrate with SQS on the callback queue, not {uri}")
        if ref_target(integration.get("Credentials")) != API_ROLE:
            err(f"{k}: must send with {API_ROLE}")
        if "Action=SendMessage" not in json.dumps(integration.get("RequestTemplates", {})):
            err(f"{k}: its request template must be a SendMessage")
elif of_type("AWS::ApiGateway::RestApi"):
    err("an API Gateway API without CallbackApiRole")
for k, v in of_type("AWS::IAM::Role").items():
    if k not in roles_used.values():
        err(f"role {k} belongs to no function")
for kind in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
    if of_type(kind):
        err(f"unexpected {kind}: keep each function's grants inline in its role")

# ---------------------------------------------------------------- alarms
alarms = of_type("AWS::CloudWatch::Alarm")


def dims(p):
    return {d["Name"]: ref_target(d["Value"]) if isinstance(d["Value"], dict) else d["Value"] for d in p.get("Dimensions", [])}


for k, v in alarms.items():
    p = v["Properties"]
    if ref_target(as_list(p.get("AlarmActions", [None]))[0]) != "AlertTopic":
        err(f"alarm {k}: must notify AlertTopic")
dlq_alarmed = {dims(a["Properties"]).get("QueueName") for a in alarms.values()
               if a["Properties"].get("MetricName") == "ApproximateNumberOfMessagesVisible"
               and a["Properties"].get("ComparisonOperator") == "GreaterThanThreshold"
               and a["Properties"].get("Threshold") == 0}
for name, (k, _) in queues.items():
    if name.endswith("-dlq") and k not in dlq_alarmed:
        err(f"DLQ {name}: no depth > 0 alarm")
for short, k in fid.items():
    for metric in ("Errors", "Throttles"):
        if not any(a["Properties"].get("MetricName") == metric and dims(a["Properties"]).get("FunctionName") == k for a in alarms.values()):
            err(f"{short}: no {metric} alarm")
sup = [a["Properties"] for a in alarms.values() if a["Properties"].get("MetricName") == "Invocations"
       and dims(a["Properties"]).get("FunctionName") == fid.get("supervisor")]
if not sup or sup[0].get("TreatMissingData") != "breaching" or sup[0].get("ComparisonOperator") != "LessThanThreshold":
    err("supervisor: no 'not running' alarm (Invocations < threshold, missing data breaching)")
flat = json.dumps(alarms)
for metric in ("OrdersFailed", "StaleReplies", "CallbacksTimedOut", "SweepsCutShort"):
    if f'"{metric}"' not in flat:
        err(f"no alarm on {metric}")

# ---------------------------------------------------------------- dashboard
for k, v in of_type("AWS::CloudWatch::Dashboard").items():
    body = v["Properties"]["DashboardBody"]
    text = body["Fn::Sub"] if isinstance(body, dict) else body
    text = text if isinstance(text, str) else text[0]
    refs = set(re.findall(r"\$\{([\w:.]+)\}", text))
    for ref in refs:
        base = ref.split(".")[0]
        if base not in R and base not in t.get("Parameters", {}) and not base.startswith("AWS::"):
            err(f"dashboard: ${{{ref}}} names nothing")
    resolved = re.sub(r"\$\{([\w:.]+)\}", lambda m: "600" if m.group(1) == "QueueAgeThresholdSeconds" else "X-" + m.group(1), text)
    try:
        doc = json.loads(resolved)
    except ValueError as e:
        err(f"dashboard: body is not JSON after substitution: {e}")
        continue
    shown = set()
    for w in doc.get("widgets", []):
        if w.get("type") == "alarm":
            shown |= set(w["properties"]["alarms"])
    for a in alarms:
        if f"X-{a}.Arn" not in shown:
            err(f"dashboard: alarm {a} not in the alarm widget")
if not of_type("AWS::CloudWatch::Dashboard"):
    err("no dashboard")

# ---------------------------------------------------------------- metrics and logs
# Alarms and dashboard must name metrics the code emits (names in shared/src/ports.rs),
# or they watch nothing and never fire.
ports = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "shared", "src", "ports.rs")
if os.path.exists(ports):
    emitted = set(re.findall(r'Metric::\w+\s*=>\s*"(\w+)"', open(ports, encoding="utf-8").read()))
    used = set()
    for a in alarms.values():
        p = a["Properties"]
        if p.get("Namespace") == {"Ref": "MetricsNamespace"}:
            used.add(p["MetricName"])
        for m in p.get("Metrics", []):
            metric = m.get("MetricStat", {}).get("Metric", {})
            if metric.get("Namespace") == {"Ref": "MetricsNamespace"}:
                used.add(metric["MetricName"])
    for d in of_type("AWS::CloudWatch::Dashboard").values():
        body = d["Properties"]["DashboardBody"]
        text = body["Fn::Sub"] if isinstance(body, dict) else body
        used |= set(re.findall(r'\["\$\{MetricsNamespace\}", "(\w+)"', text))
        used |= set(re.findall(r'MetricName=\\"(\w+)\\"', text))
    if not emitted:
        err("could not read metric names from shared/src/ports.rs")
    for name in sorted(used - emitted):
        err(f"metric {name} is watched but the code never emits it (shared/src/ports.rs)")
# Lambda gives level-less lines (EMF) the level INFO; WARN or above would drop metrics.
levels = set(t.get("Parameters", {}).get("LogLevel", {}).get("AllowedValues", []))
if levels - {"TRACE", "DEBUG", "INFO"}:
    err(f"LogLevel allows {sorted(levels - {'TRACE', 'DEBUG', 'INFO'})}: Lambda would drop the EMF metric lines")

# ---------------------------------------------------------------- outputs
outputs = {ref_target(o["Value"]) for o in t.get("Outputs", {}).values()}
for k in ["OrdersQueue", "SchedulerQueue", "AgentQueue", "CallbackQueue", "OrdersDlq", "SchedulerDlq", "AgentDlq",
          "CallbackDlq", "StatusQueue", "StateTable", "AlertTopic"]:
    if k not in outputs:
        err(f"outputs: nothing for {k}")

if errors:
    for e in errors:
        print(f"contract: {e}", file=sys.stderr)
    print(f"==> contract checks: {len(errors)} finding(s)", file=sys.stderr)
    sys.exit(1)
print(f"==> contract checks: 0 findings ({len(R)} resources, {len(alarms)} alarms)", file=sys.stderr)
