//! `kernels-cli`: see `kernels-cli --help` and the README's "Command-line tool" section.

use clap::Parser;
use kernels_cli::{Cli, run};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            // One line, whatever a driver message may hold.
            let msg = e.to_string().replace('\n', " ");
            eprintln!("kernels-cli: error: {msg}");
            ExitCode::FAILURE
        }
    }
}
