//! Running `cargo build` for `cargo stackscope` and finding the executable it made in cargo's
//! JSON messages, as `cargo run` chooses it.

use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::BuildArgs;

/// What the build gave.
pub(super) enum Built {
    /// The executable to profile.
    Executable(PathBuf),
    /// Cargo failed (its errors already on stderr), with this exit code.
    Failed(i32),
}

/// An executable cargo reported building (a `compiler-artifact` message with `executable`).
struct Artifact {
    package_id: String,
    kinds: Vec<String>,
    name: String,
    executable: PathBuf,
}

/// Builds what `args` choose; on success, the executable to profile.
pub(super) fn build(args: &BuildArgs) -> Result<Built> {
    let mut build = cargo();
    build
        .arg("build")
        // Diagnostics rendered to stderr as a plain build shows them; stdout keeps the JSON.
        .arg("--message-format=json-render-diagnostics")
        .args(build_flags(args))
        .envs(profile_env(args.profile.name()))
        .stdout(Stdio::piped());
    let mut child = build
        .spawn()
        .with_context(|| format!("cannot run {}", cargo_name().to_string_lossy()))?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut built = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo's messages")?;
        match serde_json::from_str::<Value>(&line) {
            Ok(message) => built.extend(Artifact::from_message(&message)),
            // Not a message (a build script's stray output): shown, as cargo would.
            Err(_) => eprintln!("{line}"),
        }
    }
    let status = child.wait().context("waiting for cargo build")?;
    if !status.success() {
        return Ok(Built::Failed(status.code().unwrap_or(101)));
    }
    choose(args, built).map(Built::Executable)
}

/// The `cargo build` flags standing for `args`; the profile always named, so the one the
/// environment sets up is the one built.
fn build_flags(args: &BuildArgs) -> Vec<OsString> {
    let mut flags: Vec<OsString> = vec!["--profile".into(), args.profile.name().into()];
    let mut pair = |flag: &str, value: &OsStr| flags.extend([flag.into(), value.to_owned()]);
    if let Some(package) = &args.package {
        pair("--package", package.as_ref());
    }
    if let Some((kind, name)) = args.target.chosen() {
        pair(&format!("--{kind}"), name.as_ref());
    }
    for features in &args.features {
        pair("--features", features.as_ref());
    }
    if let Some(manifest) = &args.manifest_path {
        pair("--manifest-path", manifest.as_ref());
    }
    let switches = [
        (args.all_features, "--all-features"),
        (args.no_default_features, "--no-default-features"),
        (args.locked, "--locked"),
        (args.offline, "--offline"),
    ];
    flags.extend(switches.iter().filter(|s| s.0).map(|s| s.1.into()));
    flags
}

/// Debug info on and symbols kept for `profile` and the profile cargo builds tests or
/// benches with when it inherits from it, whatever the manifests say.
fn profile_env(profile: &str) -> Vec<(String, &'static str)> {
    let inheriting = match profile {
        "release" => Some("bench"),
        "dev" => Some("test"),
        _ => None,
    };
    std::iter::once(profile)
        .chain(inheriting)
        .flat_map(|name| {
            let name = name.to_uppercase().replace('-', "_");
            [
                (format!("CARGO_PROFILE_{name}_DEBUG"), "true"),
                (format!("CARGO_PROFILE_{name}_STRIP"), "none"),
            ]
        })
        .collect()
}

/// The cargo that ran us (cargo sets CARGO for its subcommands), else the one on PATH.
fn cargo_name() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

fn cargo() -> Command {
    Command::new(cargo_name())
}

impl Artifact {
    fn from_message(message: &Value) -> Option<Artifact> {
        if message["reason"] != "compiler-artifact" {
            return None;
        }
        let target = &message["target"];
        Some(Artifact {
            package_id: message["package_id"].as_str()?.to_string(),
            kinds: target["kind"]
                .as_array()?
                .iter()
                .filter_map(|k| Some(k.as_str()?.to_string()))
                .collect(),
            name: target["name"].as_str()?.to_string(),
            executable: PathBuf::from(message["executable"].as_str()?),
        })
    }

    fn is(&self, kind: &str) -> bool {
        self.kinds.iter().any(|k| k == kind)
    }
}

/// The executable of the chosen target; without one, the only binary built, or the
/// package's `default-run` among several, as `cargo run` picks.
fn choose(args: &BuildArgs, built: Vec<Artifact>) -> Result<PathBuf> {
    if let Some((kind, name)) = args.target.chosen() {
        return match built.into_iter().find(|a| a.is(kind) && a.name == name) {
            Some(artifact) => Ok(artifact.executable),
            None => bail!("cargo built no executable for --{kind} {name}"),
        };
    }
    let mut bins: Vec<Artifact> = built.into_iter().filter(|a| a.is("bin")).collect();
    match bins.len() {
        0 => bail!("the package has no binary to profile: choose a target with --example, --test or --bench"),
        1 => return Ok(bins.remove(0).executable),
        _ => {}
    }
    if let Some(default) = default_run(args, &bins)? {
        if let Some(artifact) = bins.into_iter().find(|a| a.name == default) {
            return Ok(artifact.executable);
        }
        bail!("the `default-run` binary {default} was not built");
    }
    let mut names: Vec<&str> = bins.iter().map(|a| a.name.as_str()).collect();
    names.sort_unstable();
    bail!(
        "could not determine which binary to profile: give --bin NAME, or set `default-run` in the manifest; available binaries: {}",
        names.join(", ")
    )
}

/// The `default-run` of the package that built all of `bins`, from `cargo metadata`.
fn default_run(args: &BuildArgs, bins: &[Artifact]) -> Result<Option<String>> {
    let package = &bins[0].package_id;
    if bins.iter().any(|a| &a.package_id != package) {
        return Ok(None);
    }
    let mut metadata = cargo();
    metadata.args(["metadata", "--no-deps", "--format-version", "1"]);
    if let Some(manifest) = &args.manifest_path {
        metadata.arg("--manifest-path").arg(manifest);
    }
    let output = metadata
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo metadata")?;
    if !output.status.success() {
        bail!("cargo metadata failed ({})", output.status);
    }
    let metadata: Value =
        serde_json::from_slice(&output.stdout).context("reading cargo metadata's output")?;
    let packages = metadata["packages"].as_array().map(Vec::as_slice);
    Ok(packages
        .unwrap_or_default()
        .iter()
        .find(|p| p["id"] == package.as_str())
        .and_then(|p| p["default_run"].as_str())
        .map(str::to_string))
}
