//! The book's CLI and configuration references (`docs/src/reference/cli.md`
//! and `config.md`) are rendered here from clap's own definitions, the same
//! ones `--help` prints, and compared with the committed files: a flag added,
//! renamed or re-documented without updating the book fails this test.
//! `JOBQ_UPDATE_DOCS=1 cargo test -p jobq-cli --bin jobq docs_reference`
//! rewrites both files. Hidden flags and subcommands stay out, as they do
//! in `--help`.

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::builder::StyledStr;
use clap::{Arg, Command, CommandFactory};

use crate::cli::Cli;

const GENERATED: &str = "<!-- Generated from the clap definitions by \
`JOBQ_UPDATE_DOCS=1 cargo test -p jobq-cli --bin jobq docs_reference`; \
edit the doc comments in the code, not this file. -->";

/// Help text as markdown: clap's `Display` drops the styling, and outside
/// `code spans` a `<name>` or a `*` (cron fields) is escaped, so that it
/// reads as written rather than as an HTML tag or emphasis.
fn text(s: Option<&StyledStr>) -> String {
    let Some(s) = s else {
        return String::new();
    };
    let mut out = String::new();
    for (i, part) in s.to_string().trim().split('`').enumerate() {
        if i > 0 {
            out.push('`');
        }
        if i % 2 == 1 {
            out.push_str(part);
        } else {
            out.push_str(&part.replace('<', "&lt;").replace('*', "\\*"));
        }
    }
    out
}

fn long_help(arg: &Arg) -> String {
    let long = text(arg.get_long_help());
    if long.is_empty() {
        text(arg.get_help())
    } else {
        long
    }
}

fn about(cmd: &Command) -> String {
    let long = text(cmd.get_long_about());
    if long.is_empty() {
        text(cmd.get_about())
    } else {
        long
    }
}

/// Arguments `--help` shows, in its order, without `--help`/`--version`.
fn visible_args(cmd: &Command) -> Vec<&Arg> {
    cmd.get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .collect()
}

fn value_names(arg: &Arg) -> String {
    match arg.get_value_names() {
        Some(names) => names
            .iter()
            .map(|n| format!("<{n}>"))
            .collect::<Vec<_>>()
            .join(" "),
        None => format!("<{}>", arg.get_id().as_str().to_uppercase()),
    }
}

/// `-s, --long <VALUE>`, or `<NAME>` for a positional argument.
fn signature(arg: &Arg) -> String {
    if arg.is_positional() {
        let mut s = value_names(arg);
        if matches!(arg.get_num_args(), Some(r) if r.max_values() > 1) {
            s.push_str("...");
        }
        return s;
    }
    let mut s = String::new();
    if let Some(short) = arg.get_short() {
        write!(s, "-{short}, ").unwrap();
    }
    if let Some(long) = arg.get_long() {
        write!(s, "--{long}").unwrap();
    }
    if arg.get_action().takes_values() {
        write!(s, " {}", value_names(arg)).unwrap();
    }
    s
}

/// What `--help` says in brackets: env, default, possible values.
fn facts(arg: &Arg) -> Vec<String> {
    let mut facts = Vec::new();
    if let Some(env) = arg.get_env().filter(|_| !arg.is_hide_env_set()) {
        facts.push(format!("env `{}`", env.to_string_lossy()));
    }
    let takes_values = arg.get_action().takes_values();
    let defaults = arg.get_default_values();
    // An empty default ("") is what `--help` leaves out too.
    let shown = defaults.iter().any(|d| !d.is_empty());
    if takes_values && shown && !arg.is_hide_default_value_set() {
        let d: Vec<_> = defaults.iter().map(|d| d.to_string_lossy()).collect();
        facts.push(format!("default `{}`", d.join(",")));
    }
    let values: Vec<_> = arg
        .get_possible_values()
        .into_iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| format!("`{}`", v.get_name()))
        .collect();
    if takes_values && !values.is_empty() {
        facts.push(format!("one of {}", values.join(", ")));
    }
    if arg.is_required_set() && !arg.is_positional() {
        facts.push("required".into());
    }
    facts
}

/// One argument as a list item; help paragraphs indented under it.
fn list_item(out: &mut String, arg: &Arg) {
    let facts = facts(arg);
    let facts = if facts.is_empty() {
        String::new()
    } else {
        format!(" ({})", facts.join(", "))
    };
    writeln!(out, "- `{}`{facts}", signature(arg)).unwrap();
    let help = long_help(arg);
    if !help.is_empty() {
        writeln!(out).unwrap();
        for line in help.lines() {
            if line.trim().is_empty() {
                writeln!(out).unwrap();
            } else {
                writeln!(out, "  {line}").unwrap();
            }
        }
    }
    writeln!(out).unwrap();
}

/// The root command, built, so that usages carry their full bin names and
/// global flags are known to every subcommand.
fn root() -> Command {
    let mut cmd = Cli::command();
    cmd.build();
    cmd
}

fn is_global(root: &Command, arg: &Arg) -> bool {
    root.get_arguments()
        .any(|g| g.is_global_set() && g.get_id() == arg.get_id())
}

fn render_command(out: &mut String, root: &Command, cmd: &Command, path: &str) {
    if cmd.is_hide_set() {
        return;
    }
    writeln!(out, "## `{path}`\n").unwrap();
    let about = about(cmd);
    if !about.is_empty() {
        writeln!(out, "{about}\n").unwrap();
    }
    let usage = cmd.clone().render_usage().to_string();
    let usage = usage.trim().trim_start_matches("Usage: ");
    writeln!(out, "```text\n{usage}\n```\n").unwrap();
    if cmd.get_name() == "serve" {
        writeln!(
            out,
            "Every flag of `jobq serve` is in the [configuration reference](config.md).\n"
        )
        .unwrap();
    } else {
        let args: Vec<_> = visible_args(cmd)
            .into_iter()
            .filter(|a| !is_global(root, a))
            .collect();
        for arg in args {
            list_item(out, arg);
        }
    }
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        render_command(out, root, sub, &format!("{path} {}", sub.get_name()));
    }
}

fn render_cli() -> String {
    let root = root();
    let mut out = String::new();
    writeln!(out, "# CLI reference\n\n{GENERATED}\n").unwrap();
    writeln!(
        out,
        "Every command and flag of the `jobq` binary, as its `--help` shows them. \
         [The command line](../cli.md) explains them with examples.\n"
    )
    .unwrap();
    writeln!(out, "{}\n", about(&root)).unwrap();
    writeln!(
        out,
        "## Global options\n\nValid on every command, before or after its name \
         (`-h`/`--help` and `-V`/`--version` too).\n"
    )
    .unwrap();
    for arg in visible_args(&root) {
        if arg.is_global_set() {
            list_item(&mut out, arg);
        }
    }
    for sub in root.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        render_command(&mut out, &root, sub, &format!("jobq {}", sub.get_name()));
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

fn render_config() -> String {
    let root = root();
    let serve = root
        .get_subcommands()
        .find(|c| c.get_name() == "serve")
        .expect("jobq has a serve subcommand");
    let mut out = String::new();
    writeln!(out, "# Configuration reference\n\n{GENERATED}\n").unwrap();
    writeln!(
        out,
        "Every setting of `jobq serve`: a flag, and the environment variable \
         named beside it. [Configuration](../configuration.md) says how they \
         fit together.\n"
    )
    .unwrap();
    for arg in visible_args(serve)
        .into_iter()
        .filter(|a| !is_global(&root, a))
    {
        let name = arg
            .get_long()
            .map(|l| format!("--{l}"))
            .unwrap_or_else(|| signature(arg));
        writeln!(out, "## `{name}`\n").unwrap();
        let facts = facts(arg);
        let facts = if facts.is_empty() {
            String::new()
        } else {
            format!(" · {}", facts.join(" · "))
        };
        writeln!(out, "`{}`{facts}\n", signature(arg)).unwrap();
        let help = long_help(arg);
        if !help.is_empty() {
            writeln!(out, "{help}\n").unwrap();
        }
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

/// Compares `rendered` with the committed file, or rewrites the file when
/// `JOBQ_UPDATE_DOCS` is set.
fn check(rel: &str, rendered: &str) {
    let path: PathBuf = [env!("CARGO_MANIFEST_DIR"), "../../docs/src/reference", rel]
        .iter()
        .collect();
    if std::env::var_os("JOBQ_UPDATE_DOCS").is_some() {
        std::fs::write(&path, rendered).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != rendered {
        let line = committed
            .lines()
            .zip(rendered.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(rendered.lines().count()));
        panic!(
            "docs/src/reference/{rel} is not what the clap definitions say (first \
             difference at line {}: committed {:?}, generated {:?}).\nRewrite it with:\n  \
             JOBQ_UPDATE_DOCS=1 cargo test -p jobq-cli --bin jobq docs_reference\n\
             and commit the result.",
            line + 1,
            committed.lines().nth(line).unwrap_or("<end of file>"),
            rendered.lines().nth(line).unwrap_or("<end of file>"),
        );
    }
}

#[test]
fn the_cli_reference_is_what_clap_says() {
    check("cli.md", &render_cli());
}

#[test]
fn the_configuration_reference_is_what_clap_says() {
    check("config.md", &render_config());
}

#[test]
fn hidden_flags_stay_out_of_the_references() {
    let root = root();
    let (cli, config) = (render_cli(), render_config());
    let mut hidden = Vec::new();
    fn walk<'a>(cmd: &'a Command, hidden: &mut Vec<&'a str>) {
        for arg in cmd.get_arguments() {
            if let (true, Some(long)) = (arg.is_hide_set(), arg.get_long()) {
                hidden.push(long);
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, hidden);
        }
    }
    walk(&root, &mut hidden);
    for long in hidden {
        let flag = format!("`--{long}");
        assert!(
            !cli.contains(&flag) && !config.contains(&flag),
            "the hidden flag --{long} is in a reference"
        );
    }
}
