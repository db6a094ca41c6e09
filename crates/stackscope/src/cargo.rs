//! `cargo stackscope`: build a target of a cargo package with debug info, then profile it as
//! `stackscope record` does (the same flags, the same recording) and write a flamegraph.
//!
//! The build is cargo's own (`cargo build`), steered only through the environment, so the
//! user's manifests stay untouched; which executable it made is read from cargo's JSON
//! messages ([`artifact`]), never guessed from the target directory's layout.

mod artifact;

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, Parser};

use crate::cli::RecordArgs;

/// `cargo stackscope -h`'s examples, which `--help` follows with more.
const EXAMPLES: &str = "Examples:\n  \
    cargo stackscope -- arg1 arg2                 # the package's binary, release\n  \
    cargo stackscope --bin server -d 5 -o server.json\n  \
    cargo stackscope --dev --example demo -F 4999\n  \
    cargo stackscope --bench parse -- parse_large  # run with --bench\n  \
    cargo stackscope -p member --test integration  # a test target of a member";

#[derive(Parser)]
// `-h` is one screen: what to build, and the recording's rate, duration and output.
#[command(
    name = "cargo-stackscope",
    bin_name = "cargo stackscope",
    version,
    about = "Build a target with debug info and profile it with stackscope",
    long_about = "Build a target with debug info and profile it with stackscope.\n\n\
        Builds like `cargo build` (release by default) with the chosen profile's debug info \
        and symbols kept, through the environment only (CARGO_PROFILE_<NAME>_DEBUG=true and \
        CARGO_PROFILE_<NAME>_STRIP=none, for the chosen profile and the test or bench profile \
        inheriting from it): no manifest is edited. Then runs the built executable with ARGS \
        as `stackscope record` runs a command, and writes the flamegraph (flame.svg, as \
        `stackscope record` names it, unless -o says otherwise). Build output goes to stderr, \
        as cargo's does; the program's output is its own, and its exit code becomes cargo \
        stackscope's.",
    after_help = EXAMPLES,
    after_long_help = format!(
        "{EXAMPLES}\n\nRun `stackscope record --help` for how recording works and ends."
    ),
    mut_arg("pid", |a| a.short(None).hide(true)),
    mut_arg("tid", |a| a.short(None).hide(true)),
    mut_arg("all_cpus", |a| a.short(None).hide(true)),
    mut_arg("cpu", |a| a.short(None).hide(true)),
    // As `cargo run` and cargo-flamegraph take them: the built program's arguments only
    // after `--`, so a mistyped cargo flag is refused rather than passed to the program.
    mut_arg("command", |a| a
        .trailing_var_arg(false)
        .last(true)
        .value_name("ARGS")
        .help_heading(None)
        .help("Arguments for the profiled program, after --")),
)]
pub struct CargoArgs {
    #[command(flatten)]
    pub build: BuildArgs,

    #[command(flatten, next_help_heading = "Recording Options")]
    pub record: RecordArgs,
}

/// What to build and how: the `cargo build` flags cargo stackscope passes on.
#[derive(Args)]
pub struct BuildArgs {
    /// Package whose target to build and profile
    #[arg(
        short = 'p',
        long,
        value_name = "SPEC",
        help_heading = "Package Selection"
    )]
    pub package: Option<String>,

    #[command(flatten, next_help_heading = "Target Selection")]
    pub target: TargetChoice,

    /// Space or comma separated list of features to activate
    #[arg(
        long,
        value_name = "FEATURES",
        help_heading = "Feature Selection",
        hide_short_help = true
    )]
    pub features: Vec<String>,

    /// Activate all available features
    #[arg(long, help_heading = "Feature Selection", hide_short_help = true)]
    pub all_features: bool,

    /// Do not activate the `default` feature
    #[arg(long, help_heading = "Feature Selection", hide_short_help = true)]
    pub no_default_features: bool,

    #[command(flatten, next_help_heading = "Compilation Options")]
    pub profile: ProfileChoice,

    /// Path to Cargo.toml
    #[arg(
        long,
        value_name = "PATH",
        help_heading = "Manifest Options",
        hide_short_help = true
    )]
    pub manifest_path: Option<PathBuf>,

    /// Assert that `Cargo.lock` will remain unchanged
    #[arg(long, help_heading = "Manifest Options", hide_short_help = true)]
    pub locked: bool,

    /// Run without accessing the network
    #[arg(long, help_heading = "Manifest Options", hide_short_help = true)]
    pub offline: bool,
}

/// Which executable target to profile; without one, the package's only binary (or its
/// `default-run`).
#[derive(Args)]
#[group(multiple = false)]
pub struct TargetChoice {
    /// Profile the specified binary
    #[arg(long, value_name = "NAME")]
    pub bin: Option<String>,

    /// Profile the specified example
    #[arg(long, value_name = "NAME")]
    pub example: Option<String>,

    /// Profile the specified test target
    #[arg(long, value_name = "NAME")]
    pub test: Option<String>,

    /// Profile the specified bench target (run with --bench)
    #[arg(long, value_name = "NAME")]
    pub bench: Option<String>,
}

/// Which cargo profile to build with; release unless told.
#[derive(Args)]
#[group(multiple = false)]
pub struct ProfileChoice {
    /// Build with the release profile (the default)
    #[arg(short = 'r', long)]
    pub release: bool,

    /// Build with the dev profile
    #[arg(long)]
    pub dev: bool,

    /// Build with the specified profile
    #[arg(long, value_name = "PROFILE-NAME", hide_short_help = true)]
    pub profile: Option<String>,
}

impl TargetChoice {
    /// The chosen target as cargo's JSON names its kind, and its name.
    fn chosen(&self) -> Option<(&'static str, &str)> {
        [
            ("bin", &self.bin),
            ("example", &self.example),
            ("test", &self.test),
            ("bench", &self.bench),
        ]
        .into_iter()
        .find_map(|(kind, name)| Some((kind, name.as_deref()?)))
    }
}

impl ProfileChoice {
    fn name(&self) -> &str {
        match &self.profile {
            Some(name) => name,
            None if self.dev => "dev",
            None => "release",
        }
    }
}

/// Runs `cargo stackscope` with the process's arguments and exits with its status.
pub fn main() -> ! {
    let args: CargoArgs = crate::cli::parse(argv(std::env::args_os()));
    crate::status::exit(run(args))
}

/// The command line without the `stackscope` cargo inserts when it runs a subcommand
/// (`cargo stackscope X` runs `cargo-stackscope stackscope X`), so that running
/// `cargo-stackscope X` directly means the same.
fn argv(args: impl Iterator<Item = OsString>) -> Vec<OsString> {
    let mut args: Vec<OsString> = args.collect();
    if args.get(1).is_some_and(|a| a == "stackscope") {
        args.remove(1);
    }
    args
}

/// Builds, then records the built executable; returns the program's exit code (or cargo's,
/// when the build failed).
pub fn run(mut args: CargoArgs) -> Result<i32> {
    refuse_other_targets(&args.record)?;
    let executable = match artifact::build(&args.build)? {
        artifact::Built::Executable(path) => path,
        artifact::Built::Failed(code) => {
            eprintln!("stackscope: error: the build failed; nothing was profiled");
            return Ok(code);
        }
    };
    let mut command = vec![executable.into_os_string()];
    if args.build.target.bench.is_some() {
        command.push("--bench".into());
    }
    command.append(&mut args.record.command);
    args.record.command = command;
    crate::record::run(args.record)
}

/// `record`'s other targets have no place here: the target is what cargo builds, and `-p`
/// names a package.
fn refuse_other_targets(record: &RecordArgs) -> Result<()> {
    if !record.target.pid.is_empty() || !record.target.tid.is_empty() || record.all_cpus {
        bail!("cargo stackscope profiles the program it builds: use `stackscope record` for --pid, --tid or --all-cpus");
    }
    if record.cpu.cpu.is_some() {
        bail!("--cpu selects a CPU of a whole-system profile: use `stackscope record -a -C`");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn definitions_are_consistent() {
        CargoArgs::command().debug_assert();
    }

    #[test]
    fn the_subcommand_name_cargo_passes_is_dropped() {
        let parse = |argv: &[&str]| {
            let argv = self::argv(argv.iter().map(OsString::from));
            CargoArgs::try_parse_from(argv).map_err(|e| e.to_string())
        };
        let args = parse(&["cargo-stackscope", "stackscope", "--bin", "b", "--", "x"]).unwrap();
        assert_eq!(args.build.target.chosen(), Some(("bin", "b")));
        assert_eq!(args.record.command, vec![OsString::from("x")]);
        let args = parse(&["cargo-stackscope", "-p", "pkg", "--dev", "-F", "99"]).unwrap();
        assert_eq!(args.build.package.as_deref(), Some("pkg"));
        assert_eq!(args.build.profile.name(), "dev");
        assert_eq!(args.record.rate.frequency.frequency, Some(99));
        assert_eq!(
            parse(&["cargo-stackscope"]).unwrap().build.profile.name(),
            "release"
        );
        assert!(parse(&["cargo-stackscope", "--bin", "a", "--example", "b"]).is_err());
        assert!(parse(&["cargo-stackscope", "--dev", "--release"]).is_err());
        // The program's arguments come after `--` only, as for `cargo run`.
        assert!(parse(&["cargo-stackscope", "--bin", "b", "x"]).is_err());
    }
}
