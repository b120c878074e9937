//! `sasctl tasks show ID`: one consistent read of the task, printed with its timeline and
//! the commands that apply to it now.

use std::process::ExitCode;

use super::{Context, ShowArgs, TasksError, list::now, order_id, policy, render};

pub async fn run(args: &ShowArgs) -> Result<ExitCode, TasksError> {
    let id = order_id(&args.id)?;
    let policy = policy()?;
    let ctx = Context::connect(&args.common).await?;
    let Some(task) = ctx.task(&id).await? else {
        eprintln!("sasctl: no task {id} in table {}", ctx.table);
        return Ok(ExitCode::FAILURE);
    };
    let wf = render::workflow_of(&ctx.definitions, &task);
    let now = now();
    let flags = render::deployment_flags(&args.common.deployment, args.common.workflows.as_deref());
    let next = render::next_commands(&task, wf, &policy, now, &flags);
    if args.common.json {
        println!("{}", render::show_json(&task, wf, now, &next));
    } else {
        print!("{}", render::show_text(&task, wf, now, &next));
        if wf.is_none() {
            eprintln!(
                "sasctl: {} does not define workflow {:?} v{}: step names unknown (pass --workflows FILE)",
                ctx.definitions_from, task.workflow, task.workflow_version
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
