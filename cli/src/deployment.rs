//! Finding a deployment for the operator commands: the state table, the four work
//! queues (orders, scheduler, agent, callbacks) with their dead-letter queues, and the
//! alert topic, and who is acting.
//!
//! Every operator command flattens [`DeploymentArgs`] into its own arguments and calls
//! [`DeploymentArgs::resolve`]. What it finds comes from, highest precedence first:
//!
//! 1. explicit flags (`--table`, `--orders-queue`, `--scheduler-queue`, `--agent-queue`,
//!    `--callback-queue`, `--alert-topic`); a queue given this way has its dead-letter
//!    queue read from its redrive policy;
//! 2. `--stack NAME`: the stack's outputs (`StateTableName`, `OrdersQueueUrl`,
//!    `OrdersDlqUrl`, ..., `AlertTopicArn`, as template.yaml declares them);
//! 3. `--prefix P`: the names every deployment uses (`P-state`, `P-orders`,
//!    `P-orders-dlq`, ..., `P-alerts`): the template's `Prefix` parameter (`sas` by
//!    default), or the `dev-xxxxxxxx` a `sasctl dev --endpoint-url ... --keep` run printed;
//! 4. the environment: `SAS_STACK`, else `SAS_PREFIX`, read only when neither `--stack`
//!    nor `--prefix` is given;
//! 5. on an emulator's endpoint (a plain `http://` `--endpoint-url` or `AWS_ENDPOINT_URL`)
//!    with no resource flag either: `sasctl up`'s default prefix, `sas-local`.
//!
//! The `reply_to` allow-list an operator action's status updates go by is the functions':
//! the status queue (`StatusQueueArn`, `P-status`, or `--status-queue-arn`), the extra
//! queues (the stack's `ExtraReplyToQueueArns`, else `REPLY_TO_EXTRA_QUEUE_ARNS`), never
//! one of the deployment's own queues ([`Deployment::reply_to_rules`]).
//!
//! `--endpoint-url` points every call at an emulator (moto, LocalStack); without it the
//! SDK's own rules apply, `AWS_ENDPOINT_URL` included.
//!
//! A resource that cannot be found does not fail [`DeploymentArgs::resolve`]: a command
//! that does not need it (listing a DLQ needs no table) still runs. The accessors
//! ([`Deployment::queue`], [`Deployment::table`], ...) return the reason as a
//! [`DeploymentError`] whose text is one line naming what was looked for, where, and how to
//! fix it. Failing to reach AWS at all, or a stack that does not exist, fails `resolve`.

use std::fmt;

use aws_config::SdkConfig;
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};

/// Read when neither `--stack` nor `--prefix` is given (`SAS_STACK` first).
pub const STACK_VAR: &str = "SAS_STACK";
pub const PREFIX_VAR: &str = "SAS_PREFIX";

/// How an operator command finds its deployment. Flatten it into the command's arguments
/// (`#[command(flatten)] deployment: DeploymentArgs`); its options appear under
/// "Deployment" in `--help`.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(next_help_heading = "Deployment")]
pub struct DeploymentArgs {
    /// The CloudFormation stack: its outputs name the table, queues and topic. Without
    /// --stack or --prefix, SAS_STACK is read, then SAS_PREFIX, and on an emulator's
    /// plain-http endpoint with neither (and no resource flag), `sasctl up`'s default
    /// prefix sas-local; the flags below override single resources.
    #[arg(long, value_name = "NAME", conflicts_with = "prefix")]
    pub stack: Option<String>,
    /// The prefix of every resource name (P-state, P-orders, P-orders-dlq, ..., P-alerts):
    /// the template's Prefix parameter, `sasctl up`'s --prefix (sas-local unless given), or
    /// a kept `sasctl dev` run's dev-xxxxxxxx.
    #[arg(long, value_name = "P")]
    pub prefix: Option<String>,
    /// The state table's name (overrides the stack or prefix).
    #[arg(long, value_name = "NAME")]
    pub table: Option<String>,
    /// The orders queue's URL; its DLQ is read from its redrive policy.
    #[arg(long, value_name = "URL")]
    pub orders_queue: Option<String>,
    /// The scheduler queue's URL; its DLQ is read from its redrive policy.
    #[arg(long, value_name = "URL")]
    pub scheduler_queue: Option<String>,
    /// The agent queue's URL; its DLQ is read from its redrive policy.
    #[arg(long, value_name = "URL")]
    pub agent_queue: Option<String>,
    /// The callback queue's URL (callback steps' completions); its DLQ is read from its
    /// redrive policy.
    #[arg(long, value_name = "URL")]
    pub callback_queue: Option<String>,
    /// The operator alert topic's ARN.
    #[arg(long, value_name = "ARN")]
    pub alert_topic: Option<String>,
    /// The status queue's ARN: on the reply_to allow-list an action's status updates go
    /// by (overrides the stack or prefix).
    #[arg(long, value_name = "ARN")]
    pub status_queue_arn: Option<String>,
    /// An AWS endpoint (moto, LocalStack) instead of AWS itself; AWS_ENDPOINT_URL is
    /// honoured as the AWS SDK does.
    #[arg(long, value_name = "URL")]
    pub endpoint_url: Option<String>,
}

/// One of the four work queues, each with a dead-letter queue. On the command line:
/// `orders`, `scheduler`, `agent`, `callbacks`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkQueue {
    Orders,
    Scheduler,
    Agent,
    /// The outside's completions of callback steps, which the scheduler consumes.
    Callbacks,
}

impl WorkQueue {
    pub const ALL: [WorkQueue; 4] =
        [WorkQueue::Orders, WorkQueue::Scheduler, WorkQueue::Agent, WorkQueue::Callbacks];

    pub fn as_str(self) -> &'static str {
        match self {
            WorkQueue::Orders => "orders",
            WorkQueue::Scheduler => "scheduler",
            WorkQueue::Agent => "agent",
            WorkQueue::Callbacks => "callbacks",
        }
    }

    /// `orders`, `scheduler`, `agent` or `callbacks`, as typed; anything else is `None`.
    pub fn parse(name: &str) -> Option<WorkQueue> {
        WorkQueue::ALL.into_iter().find(|q| q.as_str() == name)
    }

    fn flag(self) -> &'static str {
        match self {
            WorkQueue::Orders => "--orders-queue",
            WorkQueue::Scheduler => "--scheduler-queue",
            WorkQueue::Agent => "--agent-queue",
            WorkQueue::Callbacks => "--callback-queue",
        }
    }

    /// The stack outputs of the queue and of its DLQ (template.yaml's Outputs).
    fn outputs(self) -> (&'static str, &'static str) {
        match self {
            WorkQueue::Orders => ("OrdersQueueUrl", "OrdersDlqUrl"),
            WorkQueue::Scheduler => ("SchedulerQueueUrl", "SchedulerDlqUrl"),
            WorkQueue::Agent => ("AgentQueueUrl", "AgentDlqUrl"),
            WorkQueue::Callbacks => ("CallbackQueueUrl", "CallbackDlqUrl"),
        }
    }

    /// The functions' variables naming the queue and its DLQ (`sas::config::OWN_QUEUE_VARIABLES`).
    fn variables(self) -> (&'static str, &'static str) {
        match self {
            WorkQueue::Orders => ("ORDERS_QUEUE_URL", "ORDERS_DLQ_URL"),
            WorkQueue::Scheduler => ("SCHEDULER_QUEUE_URL", "SCHEDULER_DLQ_URL"),
            WorkQueue::Agent => ("AGENT_QUEUE_URL", "AGENT_DLQ_URL"),
            WorkQueue::Callbacks => ("CALLBACK_QUEUE_URL", "CALLBACK_DLQ_URL"),
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for WorkQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where the deployment's names came from, for messages ("stack sas", "prefix dev-1a2b").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// `--stack` or `SAS_STACK`.
    Stack(String),
    /// `--prefix` or `SAS_PREFIX`.
    Prefix(String),
    /// Neither: only the explicit flags name resources.
    Flags,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Stack(s) => write!(f, "stack {s}"),
            Origin::Prefix(p) => write!(f, "prefix {p}"),
            Origin::Flags => f.write_str("the command-line flags"),
        }
    }
}

/// Why a deployment, or one of its resources, or the caller's identity, could not be
/// found. Each displays as one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeploymentError {
    #[error("--endpoint-url {url:?} is not an http(s) URL such as http://127.0.0.1:4566")]
    NotAUrl { url: String },
    #[error(
        "stack {stack} not found at {at}: check --stack or SAS_STACK, and the region (AWS_REGION or the profile's)"
    )]
    NoSuchStack { stack: String, at: String },
    /// A resource the command needs, not found: `what` names it, `why` says where it was
    /// looked for, `fix` how to name it.
    #[error("no {what}: {why}; {fix}")]
    Missing { what: String, why: String, fix: String },
    /// A call to AWS failed: what was being done, at which endpoint, and why.
    #[error("{doing} at {at} failed: {reason}")]
    Aws { doing: String, at: String, reason: String },
    /// STS GetCallerIdentity failed: an operator action must name who did it.
    #[error(
        "cannot tell who is acting (STS GetCallerIdentity at {at}: {reason}); an operator action must name a real identity: check the credentials (aws sts get-caller-identity)"
    )]
    NoIdentity { at: String, reason: String },
    /// The deployment's `reply_to` rules could not be built from what was found.
    #[error("the deployment's reply_to allow-list: {0}")]
    ReplyTo(String),
}

/// A resource's address, or why it was not found.
type Found = Result<String, Missing>;

#[derive(Debug, Clone)]
struct Missing {
    why: String,
    fix: String,
}

/// A deployment: where to call it (SDK configuration) and its resources' addresses.
#[derive(Debug, Clone)]
pub struct Deployment {
    origin: Origin,
    at: String,
    sdk: SdkConfig,
    table: Found,
    queues: [Found; 4],
    dlqs: [Found; 4],
    alert_topic: Found,
    /// The status queue's ARN: the `reply_to` allow-list's one sure entry.
    status_queue_arn: Found,
    /// `--endpoint-url`, else `AWS_ENDPOINT_URL`: the form a local `reply_to` takes.
    endpoint: Option<String>,
    /// The stack's parameters, with `--stack` (what the functions were configured with).
    parameters: std::collections::BTreeMap<String, String>,
}

impl Deployment {
    /// A parameter the stack was deployed with (`--stack` only).
    pub fn parameter(&self, key: &str) -> Option<&str> {
        self.parameters.get(key).map(String::as_str)
    }

    /// Where the names came from.
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// The endpoint, for messages: the URL, or `AWS (us-east-1)`.
    pub fn at(&self) -> &str {
        &self.at
    }

    /// SDK configuration for any client the command needs (endpoint, region, credentials).
    pub fn sdk_config(&self) -> &SdkConfig {
        &self.sdk
    }

    /// The state table's name.
    pub fn table(&self) -> Result<&str, DeploymentError> {
        found(&self.table, "state table")
    }

    /// The work queue's URL.
    pub fn queue(&self, queue: WorkQueue) -> Result<&str, DeploymentError> {
        found(&self.queues[queue.index()], &format!("{queue} queue"))
    }

    /// The URL of the work queue's dead-letter queue.
    pub fn dlq(&self, queue: WorkQueue) -> Result<&str, DeploymentError> {
        found(&self.dlqs[queue.index()], &format!("{queue} DLQ"))
    }

    /// The operator alert topic's ARN.
    pub fn alert_topic_arn(&self) -> Result<&str, DeploymentError> {
        found(&self.alert_topic, "alert topic")
    }

    /// The `reply_to` rules of the deployment's functions (`sas::config::reply_to_rules`),
    /// from what was found: the status queue, the extra queues (the stack's
    /// `ExtraReplyToQueueArns`, else `REPLY_TO_EXTRA_QUEUE_ARNS` as the functions read it),
    /// the region and endpoint, and the eight queues, which `reply_to` may never name.
    pub fn reply_to_rules(&self) -> Result<sas::domain::ReplyToRules, DeploymentError> {
        let status = found(&self.status_queue_arn, "status queue")?.to_owned();
        let extras = match &self.origin {
            Origin::Stack(_) => self.parameter("ExtraReplyToQueueArns").map(str::to_owned),
            _ => std::env::var("REPLY_TO_EXTRA_QUEUE_ARNS").ok(),
        };
        let mut vars: Vec<(&str, String)> = vec![("STATUS_QUEUE_ARN", status)];
        vars.extend(extras.map(|e| ("REPLY_TO_EXTRA_QUEUE_ARNS", e)));
        vars.extend(self.sdk.region().map(|r| ("AWS_REGION", r.to_string())));
        vars.extend(self.endpoint.clone().map(|e| ("AWS_ENDPOINT_URL", e)));
        vars.extend(std::env::var("AWS_ENDPOINT_URL_SQS").ok().map(|e| ("AWS_ENDPOINT_URL_SQS", e)));
        for q in WorkQueue::ALL {
            let (queue, dlq) = q.variables();
            vars.extend(self.queues[q.index()].as_ref().ok().map(|u| (queue, u.clone())));
            vars.extend(self.dlqs[q.index()].as_ref().ok().map(|u| (dlq, u.clone())));
        }
        let lookup = |name: &str| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone());
        sas::config::reply_to_rules(&lookup).map_err(|e| DeploymentError::ReplyTo(e.problems.join("; ")))
    }

    /// Who is acting: the ARN STS answers for the credentials in use (see [`caller_identity`]).
    pub async fn caller_identity(&self) -> Result<String, DeploymentError> {
        caller_identity(&self.sdk, &self.at).await
    }
}

fn found<'a>(found: &'a Found, what: &str) -> Result<&'a str, DeploymentError> {
    found.as_deref().map_err(|m| DeploymentError::Missing {
        what: what.to_owned(),
        why: m.why.clone(),
        fix: m.fix.clone(),
    })
}

/// The ARN of the identity the credentials in `sdk` belong to (STS GetCallerIdentity),
/// for an operator action to record. There is no fallback (such as `$USER@host`): a
/// record of who acted must name an identity AWS vouches for, so when STS cannot answer
/// this is an error, and the caller decides whether to go on without one.
/// `at` names the endpoint in the error (see [`Deployment::at`]).
pub async fn caller_identity(sdk: &SdkConfig, at: &str) -> Result<String, DeploymentError> {
    let client = aws_sdk_sts::Client::new(sdk);
    let out = client
        .get_caller_identity()
        .send()
        .await
        .map_err(|e| DeploymentError::NoIdentity { at: at.to_owned(), reason: aws_reason(&e) })?;
    out.arn.filter(|a| !a.is_empty()).ok_or_else(|| DeploymentError::NoIdentity {
        at: at.to_owned(),
        reason: "the answer names no ARN".into(),
    })
}

impl DeploymentArgs {
    /// `--stack`, else `--prefix`, else `SAS_STACK`, else `SAS_PREFIX` (empty values
    /// count as unset).
    pub fn origin(&self) -> Origin {
        self.origin_with(&|name| std::env::var(name).ok())
    }

    fn origin_with(&self, env: &dyn Fn(&str) -> Option<String>) -> Origin {
        let set = |v: Option<String>| v.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        if let Some(stack) = set(self.stack.clone()) {
            return Origin::Stack(stack);
        }
        if let Some(prefix) = set(self.prefix.clone()) {
            return Origin::Prefix(prefix);
        }
        if let Some(stack) = set(env(STACK_VAR)) {
            return Origin::Stack(stack);
        }
        if let Some(prefix) = set(env(PREFIX_VAR)) {
            return Origin::Prefix(prefix);
        }
        // Nothing names it, on an emulator's endpoint, and no resource flag either: the
        // resources `sasctl up` makes there by default, so `tasks` after `up` needs no
        // flag. On AWS itself nothing is assumed.
        // An emulator's: plain http (AWS itself is served over TLS only).
        let local = set(self.endpoint_url.clone())
            .or_else(|| set(env("AWS_ENDPOINT_URL")))
            .is_some_and(|url| crate::endpoint::is_plain_http(&url));
        let named = [
            &self.table,
            &self.orders_queue,
            &self.scheduler_queue,
            &self.agent_queue,
            &self.callback_queue,
            &self.alert_topic,
            &self.status_queue_arn,
        ]
        .iter()
        .any(|flag| flag.is_some());
        match local && !named {
            true => Origin::Prefix(crate::up::DEFAULT_PREFIX.to_owned()),
            false => Origin::Flags,
        }
    }

    /// SDK configuration: `--endpoint-url` (checked; signed with throwaway credentials
    /// over plain http, `crate::endpoint::signing`; us-east-1 when no region is set), else
    /// the SDK's defaults, `AWS_ENDPOINT_URL` included (signed the same way over plain http). Also returns the endpoint as messages name it.
    pub async fn sdk_config(&self) -> Result<(SdkConfig, String), DeploymentError> {
        let sdk = match &self.endpoint_url {
            Some(url) => {
                crate::endpoint::check_url(url).map_err(|_| DeploymentError::NotAUrl { url: url.clone() })?;
                crate::endpoint::sdk_config(url).await
            }
            None => crate::endpoint::default_sdk_config().await,
        };
        let env_url = std::env::var("AWS_ENDPOINT_URL").ok().filter(|u| !u.is_empty());
        let at = match self.endpoint_url.clone().or(env_url) {
            Some(url) => url,
            None => match sdk.region() {
                Some(region) => format!("AWS ({region})"),
                None => "AWS (no region set)".to_owned(),
            },
        };
        Ok((sdk, at))
    }

    /// Finds the deployment: see the module documentation for the order of precedence.
    /// Fails when AWS cannot be reached, or the stack does not exist; a resource not
    /// found is reported by its accessor.
    pub async fn resolve(&self) -> Result<Deployment, DeploymentError> {
        let (sdk, at) = self.sdk_config().await?;
        let origin = self.origin();
        let name_it = "name the deployment with --stack NAME or --prefix P (or SAS_STACK / SAS_PREFIX)";
        let unnamed = |flag: &str| Missing {
            why: "no deployment named".into(),
            fix: format!("give {flag}, or {name_it}"),
        };
        let mut d = Deployment {
            table: Err(unnamed("--table")),
            queues: WorkQueue::ALL.map(|q| Err(unnamed(q.flag()))),
            dlqs: WorkQueue::ALL.map(|q| Err(unnamed(q.flag()))),
            alert_topic: Err(unnamed("--alert-topic")),
            status_queue_arn: Err(unnamed("--status-queue-arn")),
            endpoint: self
                .endpoint_url
                .clone()
                .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
                .filter(|u| !u.trim().is_empty()),
            parameters: Default::default(),
            origin: origin.clone(),
            at,
            sdk,
        };
        match &origin {
            Origin::Stack(stack) => from_stack(&mut d, stack).await?,
            Origin::Prefix(prefix) => from_prefix(&mut d, prefix).await?,
            Origin::Flags => {}
        }
        if let Some(table) = &self.table {
            d.table = Ok(table.clone());
        }
        if let Some(arn) = &self.alert_topic {
            d.alert_topic = Ok(arn.clone());
        }
        if let Some(arn) = &self.status_queue_arn {
            d.status_queue_arn = Ok(arn.clone());
        }
        let sqs = aws_sdk_sqs::Client::new(&d.sdk);
        for (queue, url) in [
            (WorkQueue::Orders, &self.orders_queue),
            (WorkQueue::Scheduler, &self.scheduler_queue),
            (WorkQueue::Agent, &self.agent_queue),
            (WorkQueue::Callbacks, &self.callback_queue),
        ] {
            if let Some(url) = url {
                d.queues[queue.index()] = Ok(url.clone());
                d.dlqs[queue.index()] = dlq_of(&sqs, &d.at, queue, url).await?;
            }
        }
        Ok(d)
    }
}

/// The stack's outputs; a missing output is that resource's reason.
async fn from_stack(d: &mut Deployment, stack: &str) -> Result<(), DeploymentError> {
    let client = aws_sdk_cloudformation::Client::new(&d.sdk);
    let out = match client.describe_stacks().stack_name(stack).send().await {
        Ok(out) => out,
        Err(e) => {
            // CloudFormation answers a missing stack with a ValidationError.
            let missing = e
                .as_service_error()
                .is_some_and(|s| s.message().is_some_and(|m| m.contains("does not exist")));
            return Err(if missing {
                DeploymentError::NoSuchStack { stack: stack.to_owned(), at: d.at.clone() }
            } else {
                DeploymentError::Aws {
                    doing: format!("reading stack {stack} (CloudFormation DescribeStacks)"),
                    at: d.at.clone(),
                    reason: aws_reason(&e),
                }
            });
        }
    };
    let Some(described) = out.stacks().first() else {
        return Err(DeploymentError::NoSuchStack { stack: stack.to_owned(), at: d.at.clone() });
    };
    let output = |key: &str, flag: &str| -> Found {
        described
            .outputs()
            .iter()
            .find(|o| o.output_key() == Some(key))
            .and_then(|o| o.output_value())
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| Missing {
                why: format!("stack {stack} has no output {key}"),
                fix: format!("deploy the current template.yaml (sam deploy), or give {flag}"),
            })
    };
    d.parameters = described
        .parameters()
        .iter()
        .filter_map(|p| Some((p.parameter_key()?.to_owned(), p.parameter_value()?.to_owned())))
        .collect();
    d.table = output("StateTableName", "--table");
    d.alert_topic = output("AlertTopicArn", "--alert-topic");
    d.status_queue_arn = output("StatusQueueArn", "--status-queue-arn");
    for q in WorkQueue::ALL {
        let (queue, dlq) = q.outputs();
        d.queues[q.index()] = output(queue, q.flag());
        d.dlqs[q.index()] = output(dlq, q.flag());
    }
    Ok(())
}

/// The names under `prefix`, each queue's URL and the topic's ARN looked up.
async fn from_prefix(d: &mut Deployment, prefix: &str) -> Result<(), DeploymentError> {
    let sqs = aws_sdk_sqs::Client::new(&d.sdk);
    let fix = |flag: &str| {
        format!(
            "check --prefix or SAS_PREFIX (the template's Prefix parameter, or the dev-xxxxxxxx a kept `sasctl dev` run printed), or give {flag}"
        )
    };
    // No lookup: the table's name is the prefix's, and a command that reads it says
    // clearly enough when it is not there.
    d.table = Ok(format!("{prefix}-state"));
    for q in WorkQueue::ALL {
        let name = format!("{prefix}-{q}");
        d.queues[q.index()] = queue_url(&sqs, &d.at, &name, None).await?.ok_or_else(|| Missing {
            why: format!("queue {name} does not exist at {}", d.at),
            fix: fix(q.flag()),
        });
        let dlq = format!("{name}-dlq");
        d.dlqs[q.index()] = queue_url(&sqs, &d.at, &dlq, None).await?.ok_or_else(|| Missing {
            why: format!("queue {dlq} does not exist at {}", d.at),
            fix: fix(q.flag()),
        });
    }
    let status = format!("{prefix}-status");
    d.status_queue_arn = match queue_url(&sqs, &d.at, &status, None).await? {
        Some(url) => queue_arn(&sqs, &d.at, &url).await?.ok_or_else(|| Missing {
            why: format!("queue {status} at {} has no QueueArn attribute", d.at),
            fix: fix("--status-queue-arn"),
        }),
        None => Err(Missing {
            why: format!("queue {status} does not exist at {}", d.at),
            fix: fix("--status-queue-arn"),
        }),
    };
    let topic = format!("{prefix}-alerts");
    d.alert_topic = topic_arn(&d.sdk, &d.at, &topic).await?.ok_or_else(|| Missing {
        why: format!("topic {topic} does not exist at {}", d.at),
        fix: fix("--alert-topic"),
    });
    Ok(())
}

/// The URL of the queue named `name` (in `account`, else the caller's), or `None` when
/// there is no such queue.
pub(crate) async fn queue_url(
    sqs: &aws_sdk_sqs::Client,
    at: &str,
    name: &str,
    account: Option<&str>,
) -> Result<Option<String>, DeploymentError> {
    let request =
        sqs.get_queue_url().queue_name(name).set_queue_owner_aws_account_id(account.map(Into::into));
    match request.send().await {
        Ok(out) => Ok(out.queue_url),
        Err(e) if e.as_service_error().is_some_and(queue_missing) => Ok(None),
        Err(e) => Err(DeploymentError::Aws {
            doing: format!("looking up queue {name} (SQS GetQueueUrl)"),
            at: at.to_owned(),
            reason: aws_reason(&e),
        }),
    }
}

/// The ARN of the queue at `url` (SQS GetQueueAttributes).
async fn queue_arn(
    sqs: &aws_sdk_sqs::Client,
    at: &str,
    url: &str,
) -> Result<Option<String>, DeploymentError> {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let out =
        sqs.get_queue_attributes().queue_url(url).attribute_names(A::QueueArn).send().await.map_err(|e| {
            DeploymentError::Aws {
                doing: format!("reading the ARN of {url} (SQS GetQueueAttributes)"),
                at: at.to_owned(),
                reason: aws_reason(&e),
            }
        })?;
    Ok(out.attributes().and_then(|a| a.get(&A::QueueArn)).filter(|a| !a.is_empty()).cloned())
}

/// SQS's "no such queue", under either of the codes AWS and emulators answer with.
pub(crate) fn queue_missing(e: &impl ProvideErrorMetadata) -> bool {
    e.code().is_some_and(|c| c.contains("NonExistentQueue") || c.contains("QueueDoesNotExist"))
}

/// The dead-letter queue of the queue at `url`, from its redrive policy.
async fn dlq_of(
    sqs: &aws_sdk_sqs::Client,
    at: &str,
    queue: WorkQueue,
    url: &str,
) -> Result<Found, DeploymentError> {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let out = sqs.get_queue_attributes().queue_url(url).attribute_names(A::RedrivePolicy).send().await;
    let out = match out {
        Ok(out) => out,
        Err(e) if e.as_service_error().is_some_and(queue_missing) => {
            return Err(DeploymentError::Missing {
                what: format!("{queue} queue"),
                why: format!("{} {url} does not exist at {at}", queue.flag()),
                fix: format!("check the URL (aws sqs list-queues) or leave out {}", queue.flag()),
            });
        }
        Err(e) => {
            return Err(DeploymentError::Aws {
                doing: format!("reading the redrive policy of {url} (SQS GetQueueAttributes)"),
                at: at.to_owned(),
                reason: aws_reason(&e),
            });
        }
    };
    let policy = out.attributes().and_then(|a| a.get(&A::RedrivePolicy)).cloned().unwrap_or_default();
    let no_dlq = |why: String| Missing {
        why,
        fix: format!("give the {queue} queue a redrive policy, or pass the DLQ's URL to the command"),
    };
    let Some(arn) = dlq_arn(&policy) else {
        return Ok(Err(no_dlq(format!("{url} has no redrive policy naming a dead-letter queue"))));
    };
    let Some((account, name)) = arn_account_and_name(&arn) else {
        return Ok(Err(no_dlq(format!("{url}'s redrive policy names {arn:?}, not an SQS queue ARN"))));
    };
    Ok(queue_url(sqs, at, name, Some(account))
        .await?
        .ok_or_else(|| no_dlq(format!("{url}'s dead-letter queue {arn} does not exist"))))
}

/// The `deadLetterTargetArn` of a queue's RedrivePolicy attribute.
fn dlq_arn(policy: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(policy).ok()?;
    value.get("deadLetterTargetArn")?.as_str().filter(|a| !a.is_empty()).map(str::to_owned)
}

/// The account and queue name of an SQS queue ARN (`arn:aws:sqs:REGION:ACCOUNT:NAME`).
pub(crate) fn arn_account_and_name(arn: &str) -> Option<(&str, &str)> {
    let parts: Vec<&str> = arn.split(':').collect();
    match parts.as_slice() {
        ["arn", _, "sqs", _, account, name] if !account.is_empty() && !name.is_empty() => {
            Some((account, name))
        }
        _ => None,
    }
}

/// The ARN of the topic named `name`, if there is one (SNS has no lookup by name).
async fn topic_arn(sdk: &SdkConfig, at: &str, name: &str) -> Result<Option<String>, DeploymentError> {
    let sns = aws_sdk_sns::Client::new(sdk);
    let suffix = format!(":{name}");
    let mut next: Option<String> = None;
    loop {
        let page =
            sns.list_topics().set_next_token(next.take()).send().await.map_err(|e| DeploymentError::Aws {
                doing: format!("looking up topic {name} (SNS ListTopics)"),
                at: at.to_owned(),
                reason: aws_reason(&e),
            })?;
        if let Some(arn) = page.topics().iter().filter_map(|t| t.topic_arn()).find(|a| a.ends_with(&suffix)) {
            return Ok(Some(arn.to_owned()));
        }
        match page.next_token {
            Some(token) if !token.is_empty() => next = Some(token),
            _ => return Ok(None),
        }
    }
}

/// An SDK call's failure in one line: what the service said, or why it could not be
/// asked, never the SDK's debug dump of the request.
pub fn aws_reason<E, R>(err: &SdkError<E, R>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: fmt::Debug + 'static,
{
    let line = match err {
        SdkError::ServiceError(service) => {
            let e = service.err();
            match (e.code(), e.message()) {
                (Some(code), Some(message)) => format!("{code}: {message}"),
                (Some(code), None) => code.to_owned(),
                // Not an AWS error at all: an emulator that does not know the call, or a
                // proxy's page.
                (None, _) => {
                    "an answer that is not an AWS error (does the endpoint support this call?)".into()
                }
            }
        }
        // The credentials chain fails inside dispatch too: not a network problem.
        SdkError::DispatchFailure(_) if mentions_credentials(err) => format!(
            "no AWS credentials ({}): set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (any values for an emulator)",
            crate::resources::innermost(err)
        ),
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) => format!(
            "it could not be reached ({}): is it running? Check --endpoint-url or AWS_ENDPOINT_URL (moto: infra/moto.sh start), and the network",
            crate::resources::innermost(err)
        ),
        SdkError::ResponseError(_) => "its answer could not be read (is it an AWS endpoint?)".into(),
        // Typically no region or no credentials: the innermost cause says which.
        _ => crate::resources::innermost(err),
    };
    crate::endpoint::one_line(&line)
}

/// Whether any error in `err`'s source chain is about credentials.
fn mentions_credentials(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = next {
        if e.to_string().to_lowercase().contains("credentials") {
            return true;
        }
        next = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> DeploymentArgs {
        DeploymentArgs::default()
    }

    #[test]
    fn flags_come_before_the_environment() {
        let env = |name: &str| match name {
            STACK_VAR => Some("from-env".to_owned()),
            PREFIX_VAR => Some("env-prefix".to_owned()),
            _ => None,
        };
        let none = |_: &str| None;
        assert_eq!(args().origin_with(&env), Origin::Stack("from-env".into()));
        assert_eq!(args().origin_with(&none), Origin::Flags);
        let prefix = DeploymentArgs { prefix: Some("dev-1".into()), ..args() };
        assert_eq!(prefix.origin_with(&env), Origin::Prefix("dev-1".into()), "--prefix beats SAS_STACK");
        let stack = DeploymentArgs { stack: Some("sas".into()), ..args() };
        assert_eq!(stack.origin_with(&env), Origin::Stack("sas".into()));
        let only_prefix = |name: &str| (name == PREFIX_VAR).then(|| "p".to_owned());
        assert_eq!(args().origin_with(&only_prefix), Origin::Prefix("p".into()));
        let blank = DeploymentArgs { stack: Some(" ".into()), ..args() };
        assert_eq!(blank.origin_with(&none), Origin::Flags, "an empty value is unset");
        // On an emulator with nothing named: `sasctl up`'s default prefix.
        let local = DeploymentArgs { endpoint_url: Some("http://127.0.0.1:5000".into()), ..args() };
        assert_eq!(local.origin_with(&none), Origin::Prefix(crate::up::DEFAULT_PREFIX.into()));
        let env_endpoint =
            |name: &str| (name == "AWS_ENDPOINT_URL").then(|| "http://127.0.0.1:4566".to_owned());
        assert_eq!(args().origin_with(&env_endpoint), Origin::Prefix(crate::up::DEFAULT_PREFIX.into()));
        let table = DeploymentArgs { table: Some("t".into()), ..local };
        assert_eq!(table.origin_with(&none), Origin::Flags, "a resource named by flag: nothing assumed");
        let tls = DeploymentArgs {
            endpoint_url: Some("https://dynamodb.us-east-1.amazonaws.com".into()),
            ..args()
        };
        assert_eq!(
            tls.origin_with(&none),
            Origin::Flags,
            "an https endpoint may be AWS itself: nothing assumed"
        );
    }

    #[test]
    fn work_queues_by_name() {
        assert_eq!(WorkQueue::parse("orders"), Some(WorkQueue::Orders));
        assert_eq!(WorkQueue::parse("agent"), Some(WorkQueue::Agent));
        assert_eq!(WorkQueue::parse("callbacks"), Some(WorkQueue::Callbacks));
        assert_eq!(WorkQueue::parse("status"), None);
        assert_eq!(WorkQueue::parse("Orders"), None);
    }

    #[test]
    fn redrive_policies_and_arns() {
        let policy = r#"{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:123456789012:sas-orders-dlq","maxReceiveCount":"5"}"#;
        let arn = dlq_arn(policy).unwrap();
        assert_eq!(arn_account_and_name(&arn), Some(("123456789012", "sas-orders-dlq")));
        assert_eq!(dlq_arn(""), None);
        assert_eq!(dlq_arn("{}"), None);
        assert_eq!(arn_account_and_name("arn:aws:sns:us-east-1:1:t"), None);
        assert_eq!(arn_account_and_name("sas-orders-dlq"), None);
    }

    /// A stack's deployment as `resolve` finds it: the allow-list is the status queue and
    /// the stack's extra queues, never one of its own queues.
    #[test]
    fn the_reply_to_rules_are_the_stacks() {
        let url = |name: &str| Ok(format!("https://sqs.us-east-1.amazonaws.com/123456789012/{name}"));
        let d = Deployment {
            origin: Origin::Stack("sas".into()),
            at: "AWS (us-east-1)".into(),
            sdk: SdkConfig::builder().region(aws_config::Region::new("us-east-1")).build(),
            table: Ok("sas-state".into()),
            queues: [url("sas-orders"), url("sas-scheduler"), url("sas-agent"), url("sas-callbacks")],
            dlqs: [
                url("sas-orders-dlq"),
                url("sas-scheduler-dlq"),
                url("sas-agent-dlq"),
                url("sas-callbacks-dlq"),
            ],
            alert_topic: Ok("arn:aws:sns:us-east-1:123456789012:sas-alerts".into()),
            status_queue_arn: Ok("arn:aws:sqs:us-east-1:123456789012:sas-status".into()),
            endpoint: None,
            parameters: [(
                "ExtraReplyToQueueArns".to_owned(),
                "arn:aws:sqs:us-east-1:210987654321:app".to_owned(),
            )]
            .into(),
        };
        let rules = d.reply_to_rules().unwrap();
        assert!(rules.allows("https://sqs.us-east-1.amazonaws.com/123456789012/sas-status").is_ok());
        assert!(rules.allows("https://sqs.us-east-1.amazonaws.com/210987654321/app").is_ok());
        for refused in ["sas-scheduler", "sas-orders-dlq", "sas-callbacks", "sas-callbacks-dlq", "elsewhere"]
        {
            assert!(rules.allows(url(refused).as_ref().unwrap()).is_err(), "{refused}");
        }
        let none = Deployment { status_queue_arn: Err(Missing { why: "w".into(), fix: "f".into() }), ..d };
        assert_eq!(none.reply_to_rules().unwrap_err().to_string(), "no status queue: w; f");
    }

    #[test]
    fn a_missing_resource_says_what_where_and_how() {
        let e = DeploymentError::Missing {
            what: "orders DLQ".into(),
            why: "stack sas has no output OrdersDlqUrl".into(),
            fix: "deploy the current template.yaml (sam deploy), or give --orders-queue".into(),
        };
        assert_eq!(
            e.to_string(),
            "no orders DLQ: stack sas has no output OrdersDlqUrl; deploy the current template.yaml (sam deploy), or give --orders-queue"
        );
    }
}
