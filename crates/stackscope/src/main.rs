//! The `stackscope` command: parses arguments, runs one command, reports errors in one line.

mod cli;
mod output;
mod record;
mod report;

use clap::Parser;

fn main() {
    let cli = cli::Cli::parse();
    let result = match cli.command {
        cli::Command::Record(args) => record::run(args),
        cli::Command::Report(args) => report::run(args),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("stackscope: error: {e:#}");
            std::process::exit(1);
        }
    }
}
