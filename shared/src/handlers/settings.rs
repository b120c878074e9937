//! The handlers' settings, assembled in one place from a function's configuration or an
//! in-process run's (`sasctl dev`, `up`, the benchmarks, the simulation), so a new setting
//! is added once and the runs cannot drift from the functions.

use crate::config::{StateConfig, UNUSED_AGENT_QUEUE};
use crate::domain::{Policy, QueueId, ReplyToRules, TaskRecord, Workflow, Workflows};
use crate::ports::{QueueUrl, Topology};

use super::HandlerError;

// Not `#[non_exhaustive]`: that binds only other crates, and the point is that no module
// of this one builds settings by hand either.
#[allow(clippy::manual_non_exhaustive)]
#[derive(Debug, Clone)]
pub struct Settings {
    pub policy: Policy,
    pub workflows: Workflows,
    pub topology: Topology,
    /// Where orders may ask for status: checked at submission and before each send.
    pub reply_to: ReplyToRules,
    /// Private: settings are only made by [`Settings::new`], so every run assembles them
    /// the one way.
    _assembled: (),
}

impl Settings {
    /// The handlers' settings. A queue agent's queue belongs to the deployment as much as
    /// the agent queue does: it is added to `reply_to`'s own queues, so status can never
    /// land among a worker's requests.
    pub fn new(
        policy: Policy,
        workflows: Workflows,
        topology: Topology,
        mut reply_to: ReplyToRules,
    ) -> Settings {
        for queue in topology.queue_agents.values() {
            reply_to = match QueueId::account_and_name(&queue.0) {
                Some((account, name)) => reply_to.own_queue(account, name),
                // An in-process run names its queues without a URL.
                None => reply_to.own_queue(String::new(), queue.0.clone()),
            };
        }
        // A map over a limited agent must take its items' places through the gate, whoever
        // built the workflows (a definition file marks them too; a bench or test may not).
        let workflows = workflows.with_gated_maps(|agent| topology.limits.contains_key(agent));
        Settings { policy, workflows, topology, reply_to, _assembled: () }
    }

    /// The settings of a Lambda function (submission, scheduler, supervisor), from its
    /// configuration. Submission and supervisor never dispatch, so they need no agent queue.
    pub fn from_config(config: &StateConfig) -> Settings {
        let agent_queue =
            config.agent_queue.clone().unwrap_or_else(|| QueueUrl(UNUSED_AGENT_QUEUE.to_owned()));
        let topology = Topology::new(config.scheduler_queue.clone(), agent_queue)
            .with_queue_agents(&config.definitions.agents);
        Settings::new(config.policy, config.definitions.workflows.clone(), topology, config.reply_to.clone())
    }

    /// The same settings with other workflows (a run that publishes a new version).
    pub fn with_workflows(self, workflows: Workflows) -> Settings {
        Settings { workflows, ..self }
    }

    /// The version the task is pinned to. One newer than this process holds is left for
    /// later, not refused: while a new version rolls out, a task accepted under it by a
    /// new container can reach one still running the old definitions, and redelivery
    /// finds a newer container. One removed from the definitions is refused (kept with
    /// the reason; the DLQ alarm tells the operator, and every supervisor run logs it).
    pub(super) fn workflow(&self, task: &TaskRecord) -> Result<&Workflow, HandlerError> {
        if crate::mutations::newest_version()
            && let Some(newest) = self.workflows.get(&task.workflow)
        {
            return Ok(newest);
        }
        let (name, version) = (&task.workflow, task.workflow_version);
        self.workflows.get_version(name, version).ok_or_else(|| {
            let why = format!("order {} runs workflow {name:?} v{version}", task.order_id);
            // A name these definitions do not hold at all is a workflow published after
            // them: the task exists, so a newer container accepted it.
            if self.workflows.get(name).is_none() || self.workflows.is_newer(name, version) {
                HandlerError::Retry(format!(
                    "{why}, newer than these definitions: left for a newer container"
                ))
            } else {
                HandlerError::Reject(format!("{why}, which the definitions no longer hold"))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SupervisorConfig;
    use crate::domain::ReplyToError;

    #[test]
    fn a_function_that_never_dispatches_has_no_agent_queue() {
        let q = "http://localhost:5000/000000000000/q";
        let vars = [
            ("STATE_TABLE", "sas-state"),
            ("SCHEDULER_QUEUE_URL", q),
            ("ALERT_TOPIC_ARN", "arn:aws:sns:us-east-1:000000000000:sas-alerts"),
            ("STATUS_QUEUE_ARN", "arn:aws:sqs:us-east-1:123456789012:sas-status"),
        ];
        let lookup = |name: &str| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string());
        let s = Settings::from_config(&SupervisorConfig::from_lookup(&lookup).unwrap().state);
        assert_eq!(s.topology.scheduler_queue.0, q);
        assert_eq!(s.topology.agent_queue.0, UNUSED_AGENT_QUEUE);
    }

    #[test]
    fn a_queue_agents_queue_is_never_a_reply_to() {
        let mut topology = Topology::new(QueueUrl("scheduler".into()), QueueUrl("agent".into()));
        let worker_url = "https://sqs.us-east-1.amazonaws.com/123456789012/worker";
        topology.queue_agents.insert("remote".into(), QueueUrl(worker_url.into()));
        topology.queue_agents.insert("local".into(), QueueUrl("local-worker".into()));
        let rules = ReplyToRules::sqs("us-east-1", None)
            .allow(QueueId::from_arn("arn:aws:sqs:us-east-1:123456789012:worker").unwrap());
        let s = Settings::new(Policy::default(), Workflows::builtin(), topology, rules);
        assert_eq!(s.reply_to.check(worker_url), Err(ReplyToError::OwnQueue));
        // An in-process run's queue agent, named rather than addressed.
        let mut topology = crate::adapters::embedded::queue_names::topology();
        topology.queue_agents.insert("local".into(), QueueUrl("worker".into()));
        let rules = crate::adapters::embedded::queue_names::reply_to_rules();
        let s = Settings::new(Policy::default(), Workflows::builtin(), topology, rules);
        assert_eq!(s.reply_to.check("worker"), Err(ReplyToError::OwnQueue));
        assert!(s.reply_to.check("status").is_ok());
    }
}
