//! `sasctl workflows`: check a definition file (alone, or against the one published
//! before it), publish it as a Lambda layer, print its JSON Schema.
//!
//! Where definitions live on AWS: in a Lambda layer (`workflows.json` at its root, so
//! `/opt/workflows.json` in every function), named by the stack's `WorkflowsLayerName` and `WorkflowsLayerVersion` (a layer of the stack's own account: the template builds the ARN).
//! Each function reads it once at cold start: no call on the way of an order, and one
//! immutable file per deployment, so all four functions agree on every version. Publishing
//! adds a layer version and updates the stack's parameter; the functions are not rebuilt,
//! and the previous layer version is the rollback.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use sas::domain::definitions::{DefinitionFile, Problem, Severity};

/// The file's problems, with those of publishing it after `previous`.
fn problems_of(file: &Path, previous: Option<&Path>) -> Result<(String, Vec<Problem>), String> {
    let text = read(file)?;
    let mut problems = match DefinitionFile::parse_all(&text) {
        Ok(parsed) => {
            let mut problems = parsed.check();
            if let Some(previous) = previous {
                let old = DefinitionFile::parse(&read(previous)?)
                    .map_err(|p| format!("{} (the previous file) does not parse: {p}", previous.display()))?;
                problems.extend(parsed.against_previous(&old));
            }
            problems
        }
        Err(problems) => problems,
    };
    problems.sort_by_key(|p| p.severity);
    Ok((text, problems))
}

fn read(file: &Path) -> Result<String, String> {
    std::fs::read_to_string(file).map_err(|e| format!("cannot read {}: {e}", file.display()))
}

/// Where the definitions a run uses come from, as messages name it: `file`, or the
/// built-in examples/workflows.json.
pub fn source_name(file: Option<&Path>) -> String {
    file.map_or_else(|| "the built-in examples/workflows.json".to_owned(), |f| f.display().to_string())
}

/// The definitions a run uses: `file`'s, or the built-in examples/workflows.json.
pub fn load(file: Option<&Path>) -> Result<sas::domain::Definitions, String> {
    let Some(file) = file else { return Ok(sas::domain::Definitions::example()) };
    sas::domain::Definitions::parse(&read(file)?)
        .map_err(|e| format!("{} is not valid (sasctl workflows validate shows why): {e}", file.display()))
}

/// Prints every problem of `file` (and of publishing it after `previous`), one line each
/// (or one JSON object each); exit 0 when it has no error, 1 when it has, and an `Err`
/// (exit 2) when it cannot be read.
pub fn validate(file: &Path, previous: Option<&Path>, json: bool) -> Result<ExitCode, String> {
    let (_, problems) = problems_of(file, previous)?;
    Ok(report(file, &problems, json))
}

fn report(file: &Path, problems: &[Problem], json: bool) -> ExitCode {
    let errors = problems.iter().filter(|p| p.severity == Severity::Error).count();
    let warnings = problems.len() - errors;
    for p in problems {
        if json {
            println!("{}", problem_json(file, p));
        } else {
            println!("{}: {p}", file.display());
        }
    }
    if json {
        let summary = serde_json::json!({"file": file.display().to_string(), "valid": errors == 0, "errors": errors, "warnings": warnings});
        println!("{summary}");
    } else if errors == 0 {
        println!("{}: valid ({warnings} warning{})", file.display(), if warnings == 1 { "" } else { "s" });
    } else {
        eprintln!("{}: {errors} error{}: not valid", file.display(), if errors == 1 { "" } else { "s" });
    }
    if errors == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// `sasctl workflows publish`.
#[derive(Debug, clap::Args)]
pub struct PublishArgs {
    /// The definition file to publish.
    pub file: PathBuf,
    /// The file published last: versions it holds must not change, new ones must come
    /// after its last (recommended; keep it in version control).
    #[arg(long, value_name = "FILE")]
    pub previous: Option<PathBuf>,
    /// The Lambda layer to add a version to.
    #[arg(long, default_value = "sas-workflows")]
    pub layer_name: String,
    /// An AWS endpoint (LocalStack, moto) instead of AWS itself.
    #[arg(long, value_name = "URL")]
    pub endpoint_url: Option<String>,
    /// Check the file and build the layer, but publish nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// One JSON object per problem, then one for the result.
    #[arg(long)]
    pub json: bool,
}

/// The layer's zip: the file as `workflows.json` at its root (so `/opt/workflows.json`).
pub fn layer_zip(text: &str) -> Result<Vec<u8>, String> {
    let mut out = std::io::Cursor::new(Vec::new());
    let mut zip = zip::ZipWriter::new(&mut out);
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .unix_permissions(0o644);
    zip.start_file("workflows.json", options).map_err(|e| format!("cannot build the layer zip: {e}"))?;
    zip.write_all(text.as_bytes()).map_err(|e| format!("cannot build the layer zip: {e}"))?;
    zip.finish().map_err(|e| format!("cannot build the layer zip: {e}"))?;
    Ok(out.into_inner())
}

/// Checks the file (and against `--previous`), then adds it as a new version of the layer
/// and says how to point the stack at it. Exit 1 on a problem, publishing nothing.
pub async fn publish(args: &PublishArgs) -> Result<ExitCode, String> {
    if let Some(url) = &args.endpoint_url {
        crate::endpoint::check_url(url).map_err(|e| e.to_string())?;
    }
    let (text, problems) = problems_of(&args.file, args.previous.as_deref())?;
    if report(&args.file, &problems, args.json) != ExitCode::SUCCESS {
        return Ok(ExitCode::FAILURE);
    }
    let parsed = DefinitionFile::parse(&text).map_err(|p| p.to_string())?;
    let versions: Vec<String> =
        parsed.workflows.iter().map(|w| format!("{} v{}", w.name, w.version)).collect();
    let zip = layer_zip(&text)?;
    let description: String = format!("sas workflows: {}", versions.join(", ")).chars().take(256).collect();
    if args.dry_run {
        if args.json {
            println!(
                "{}",
                serde_json::json!({"dry_run": true, "layer": args.layer_name, "bytes": zip.len(), "workflows": versions})
            );
        } else {
            println!(
                "dry run: would add a version of layer {} ({} bytes): {}",
                args.layer_name,
                zip.len(),
                versions.join(", ")
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let config = match &args.endpoint_url {
        Some(url) => crate::endpoint::sdk_config(url).await,
        None => crate::endpoint::default_sdk_config().await,
    };
    let client = aws_sdk_lambda::Client::new(&config);
    let published = client
        .publish_layer_version()
        .layer_name(&args.layer_name)
        .description(description)
        .content(aws_sdk_lambda::types::LayerVersionContentInput::builder().zip_file(zip.into()).build())
        .compatible_runtimes(aws_sdk_lambda::types::Runtime::Providedal2023)
        .compatible_architectures(aws_sdk_lambda::types::Architecture::Arm64)
        .send()
        .await
        .map_err(|e| {
            let at = args.endpoint_url.as_deref().unwrap_or("AWS");
            format!("publishing layer {} at {at} failed: {}", args.layer_name, sdk_failure(&e))
        })?;
    let arn = published.layer_version_arn().unwrap_or_default();
    let version = published.version();
    if args.json {
        println!(
            "{}",
            serde_json::json!({"layer_version_arn": arn, "layer_name": args.layer_name,
                               "layer_version": version, "workflows": versions})
        );
    } else {
        println!("published {arn}: {}", versions.join(", "));
        println!("point the stack at it (the functions are not rebuilt):");
        println!("  {}", deploy_line(&args.layer_name, version));
    }
    Ok(ExitCode::SUCCESS)
}

/// The command that points a stack at version `version` of layer `name`: the template takes
/// the name and version, and builds the ARN in the stack's own account.
pub fn deploy_line(name: &str, version: i64) -> String {
    format!(
        "sam deploy --parameter-overrides WorkflowsLayerName={name} WorkflowsLayerVersion={version} WorkflowsFile=/opt/workflows.json"
    )
}

fn problem_json(file: &Path, p: &Problem) -> serde_json::Value {
    let severity = match p.severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
    };
    serde_json::json!({"file": file.display().to_string(), "severity": severity, "at": p.at, "message": p.message})
}

/// The definition file's JSON Schema, pretty-printed.
pub fn schema() -> String {
    let schema = schemars::schema_for!(DefinitionFile);
    serde_json::to_string_pretty(&schema).expect("a schema always serializes")
}

/// One line for an SDK call's failure: what the service said, or that it could not be
/// reached, never the error's debug dump.
fn sdk_failure<E, R>(e: &aws_sdk_lambda::error::SdkError<E, R>) -> String
where
    E: aws_sdk_lambda::error::ProvideErrorMetadata,
{
    use aws_sdk_lambda::error::SdkError;
    match e {
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) => {
            "the endpoint could not be reached (is it running? LocalStack, or moto: infra/moto.sh)".into()
        }
        SdkError::ServiceError(service) => {
            let err = service.err();
            format!("{}: {}", err.code().unwrap_or("error"), err.message().unwrap_or("no message"))
        }
        _ => "the answer could not be read".into(),
    }
}
