//! The `roce` command. Parses the command line, runs it, and turns errors into a message (or
//! `{"error": "..."}` with `-j`) and exit code 1; clap exits 2 on usage errors.

mod cli;

use clap::Parser as _;

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = cli::Cli::parse();
    let json = cli.json || cli.pretty;
    if let Err(e) = cli::run(cli) {
        let msg = format!("{e:#}");
        if json {
            println!("{}", serde_json::json!({ "error": msg }));
        } else {
            eprintln!("roce: error: {msg}");
        }
        std::process::exit(1);
    }
}
