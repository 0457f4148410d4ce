//! `--config FILE` on the servers (`kv serve`, `rr serve`, `nvme target`): a TOML file whose
//! keys are the command's long options, read as if they were given on the command line
//! ahead of its own. An option also given on the command line keeps the command line's
//! value, so a unit file can name one file and an operator can still override one option.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow};
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Args, Command};

/// The id clap gives [`ConfigFile::config_file`].
const ID: &str = "config_file";

/// The largest options file read: a server's options fit in a few kilobytes.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// How many times a counted flag (`verbose = 2`) may be repeated from a file.
const MAX_COUNT: i64 = 8;

/// The `--config` option a server flattens into its arguments.
#[derive(Debug, Args)]
pub struct ConfigFile {
    /// Read options from a TOML file: each key is one of this command's long options
    /// (`port = 11211`, `memory-limit = "1g"`, `xps-rxqs = true`, a list for an option
    /// given more than once). An option also given on the command line takes the
    /// command line's value.
    #[arg(long = "config", value_name = "FILE")]
    pub config_file: Option<PathBuf>,
}

/// The command line to parse: `args` itself when the command takes no file or none was
/// given; otherwise the file's options inserted ahead of the end of `args` (before a
/// `--`), leaving out each option `args` gives itself.
pub fn expand(cmd: &Command, args: Vec<OsString>) -> Result<Vec<OsString>> {
    // A first look that tolerates what is missing: the file may hold a required option.
    let Ok(matches) = cmd.clone().ignore_errors(true).try_get_matches_from(&args) else {
        return Ok(args);
    };
    let (name, leaf, leaf_matches) = leaf(cmd, &matches);
    if leaf.get_arguments().all(|a| a.get_id() != ID) {
        return Ok(args);
    }
    let Some(path) = leaf_matches.get_one::<PathBuf>(ID).cloned() else {
        return Ok(args);
    };
    let extra = options_from(&path, &name, cmd, leaf, leaf_matches)?;
    let mut expanded = args.clone();
    let at = expanded.iter().position(|a| a == "--").unwrap_or(expanded.len());
    expanded.splice(at..at, extra);
    // A value clap refuses is the file's when the command line alone was fine (or lacked
    // only what the file was to give): say so with the file's name.
    if let Err(e) = cmd.clone().try_get_matches_from(&expanded) {
        let alone = cmd.clone().try_get_matches_from(&args);
        if alone.as_ref().map_or_else(|a| a.kind() == clap::error::ErrorKind::MissingRequiredArgument, |_| true) {
            let rendered = e.render().to_string();
            let first = rendered.lines().next().unwrap_or_default();
            return Err(anyhow!("{}: {}", path.display(), first.trim_start_matches("error: ")));
        }
    }
    Ok(expanded)
}

/// The subcommand that runs (its words after the program's name), and its matches.
fn leaf<'a>(cmd: &'a Command, matches: &'a ArgMatches) -> (String, &'a Command, &'a ArgMatches) {
    let (mut cmd, mut matches) = (cmd, matches);
    let mut words = Vec::new();
    while let Some((name, sub)) = matches.subcommand() {
        let Some(next) = cmd.find_subcommand(name) else { break };
        words.push(name);
        (cmd, matches) = (next, sub);
    }
    (words.join(" "), cmd, matches)
}

/// The file's options as command-line arguments, each one the command line does not give:
/// the leaf command's own (`cmd`), or the program's global ones (of `root`).
fn options_from(path: &Path, name: &str, root: &Command, cmd: &Command, given: &ArgMatches) -> Result<Vec<OsString>> {
    let text = netlane::files::read_text(path, MAX_FILE_BYTES)?;
    let table: toml::Table =
        toml::from_str(&text).map_err(|e| anyhow!("{}: {}", path.display(), syntax_error(&text, &e)))?;
    let mut out = Vec::new();
    for (key, value) in &table {
        let long = key.replace('_', "-");
        let options = || {
            cmd.get_arguments().chain(root.get_arguments().filter(|a| a.is_global_set())).filter(|a| a.get_id() != ID)
        };
        let arg = options()
            .find(|a| {
                a.get_long() == Some(long.as_str()) || a.get_all_aliases().is_some_and(|v| v.contains(&long.as_str()))
            })
            .ok_or_else(|| {
                let mut known: Vec<&str> = options().filter_map(Arg::get_long).collect();
                known.dedup();
                anyhow!("{}: `{key}` is not an option of `{name}` (its options: {})", path.display(), known.join(", "))
            })?;
        if on_command_line(given, arg) || overruled(cmd, given, arg) {
            continue;
        }
        let flag = arg.get_long().unwrap_or(&long);
        out.extend(arguments(flag, arg, value).map_err(|what| anyhow!("{}: `{key}` {what}", path.display()))?);
    }
    Ok(out)
}

fn on_command_line(given: &ArgMatches, arg: &Arg) -> bool {
    matches!(given.value_source(arg.get_id().as_str()), Some(ValueSource::CommandLine | ValueSource::EnvVariable))
}

/// Whether an option the command line gives conflicts with `arg` (`--lanes` given there
/// leaves out the file's `threads`): the command line wins there too.
fn overruled(cmd: &Command, given: &ArgMatches, arg: &Arg) -> bool {
    cmd.get_arguments().filter(|b| on_command_line(given, b)).any(|b| {
        cmd.get_arg_conflicts_with(b).iter().any(|c| c.get_id() == arg.get_id())
            || cmd.get_arg_conflicts_with(arg).iter().any(|c| c.get_id() == b.get_id())
    })
}

/// One key's value as the arguments that give it (`--long=value`: a value that starts
/// with `-` stays a value).
fn arguments(long: &str, arg: &Arg, value: &toml::Value) -> Result<Vec<OsString>, String> {
    let flag = || OsString::from(format!("--{long}"));
    let with = |v: String| OsString::from(format!("--{long}={v}"));
    // An option whose value may be left out (`--json` alone: to stdout) takes true as
    // the option alone and false as no option.
    let value_optional = arg.get_num_args().is_some_and(|n| n.min_values() == 0);
    match (arg.get_action(), value) {
        (ArgAction::Set | ArgAction::Append, toml::Value::Boolean(b)) if value_optional => {
            Ok(if *b { vec![flag()] } else { vec![] })
        }
        (ArgAction::SetTrue, toml::Value::Boolean(b)) => Ok(if *b { vec![flag()] } else { vec![] }),
        (ArgAction::SetFalse, toml::Value::Boolean(b)) => Ok(if *b { vec![] } else { vec![flag()] }),
        (ArgAction::SetTrue | ArgAction::SetFalse, _) => Err("takes true or false".into()),
        (ArgAction::Count, toml::Value::Integer(n)) if (0..=MAX_COUNT).contains(n) => {
            Ok((0..*n).map(|_| flag()).collect())
        }
        (ArgAction::Count, _) => Err(format!("takes a count from 0 to {MAX_COUNT}")),
        (ArgAction::Append, toml::Value::Array(items)) => items.iter().map(|item| scalar(item).map(with)).collect(),
        (_, toml::Value::Array(_)) => Err("takes one value, not a list".into()),
        (_, v) => Ok(vec![with(scalar(v)?)]),
    }
}

fn scalar(v: &toml::Value) -> Result<String, String> {
    match v {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        toml::Value::Array(_) | toml::Value::Table(_) | toml::Value::Datetime(_) => {
            Err("takes a string, a number or a boolean".into())
        }
    }
}

/// A TOML error as one line: where and what (the parser's own rendering quotes the line).
fn syntax_error(text: &str, e: &toml::de::Error) -> String {
    let what = e.message().trim().replace('\n', " ");
    let Some(span) = e.span() else { return what };
    let before = text.get(..span.start).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("line {line}, column {column}: {what}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: Sub,
    }

    #[derive(Debug, clap::Subcommand)]
    enum Sub {
        Serve {
            #[arg(long)]
            port: u16,
            #[arg(long = "memory-limit", visible_alias = "memory", default_value = "64")]
            memory: String,
            #[arg(long)]
            xps_rxqs: bool,
            #[arg(short, long, action = ArgAction::Count)]
            verbose: u8,
            #[arg(long)]
            tag: Vec<String>,
            #[arg(long, num_args = 0..=1, default_missing_value = "-")]
            json: Option<String>,
            #[arg(long, allow_negative_numbers = true)]
            offset: Option<i32>,
            #[arg(long)]
            name: Option<String>,
            #[command(flatten)]
            config: ConfigFile,
        },
        Other {
            #[arg(long)]
            port: Option<u16>,
        },
    }

    /// A file in the temporary directory, removed when dropped.
    struct File(PathBuf);

    impl File {
        fn new(text: &str) -> File {
            static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!("netlane-config-test-{}-{n}.toml", std::process::id()));
            std::fs::write(&path, text).unwrap();
            File(path)
        }
    }

    impl Drop for File {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn run(text: &str, args: &[&str]) -> Result<Sub> {
        let f = File::new(text);
        let mut argv: Vec<OsString> = ["netlane", "serve", "--config"].iter().map(OsString::from).collect();
        argv.push(f.0.clone().into());
        argv.extend(args.iter().map(OsString::from));
        let argv = expand(&Cli::command(), argv)?;
        Ok(Cli::try_parse_from(argv)?.cmd)
    }

    #[test]
    fn the_file_supplies_options_and_the_command_line_wins() {
        let text = "port = 11211\nmemory_limit = \"1g\"\nxps-rxqs = true\nverbose = 2\ntag = [\"a\", \"b\"]\n";
        let Sub::Serve { port, memory, xps_rxqs, verbose, tag, .. } = run(text, &[]).unwrap() else { panic!() };
        assert_eq!((port, memory.as_str(), xps_rxqs, verbose), (11211, "1g", true, 2));
        assert_eq!(tag, ["a", "b"]);
        let Sub::Serve { port, memory, tag, .. } = run(text, &["--port", "7", "--memory", "2g", "--tag", "c"]).unwrap()
        else {
            panic!()
        };
        assert_eq!((port, memory.as_str()), (7, "2g"));
        assert_eq!(tag, ["c"], "a list on the command line replaces the file's");
    }

    #[test]
    fn an_option_of_the_file_that_conflicts_with_the_command_line_is_left_out() {
        let argv = with_file(&["kv", "serve", "--lanes", "1"], "threads = 2\nport = -1\n").unwrap();
        assert!(!argv.iter().any(|a| a.to_string_lossy().starts_with("--threads")), "{argv:?}");
        assert!(crate::Cli::try_parse_from(argv).is_ok());
        // The program's global options may be in the file too; an unknown key's error
        // names the whole command.
        let argv = with_file(&["rr", "serve"], "verbose = 2\n").unwrap();
        assert_eq!(crate::Cli::try_parse_from(argv).unwrap().verbose, 2);
        let e = with_file(&["rr", "serve"], "batchsize = 8\n").unwrap_err();
        assert!(
            e.to_string().contains("`batchsize` is not an option of `rr serve` (its options: listen, path,"),
            "{e}"
        );
    }

    /// `netlane WORDS... --config FILE` of the real command line, FILE holding `text`,
    /// expanded.
    fn with_file(words: &[&str], text: &str) -> Result<Vec<OsString>> {
        let f = File::new(text);
        let argv = ["netlane"].iter().chain(words).chain(&["--config"]).map(OsString::from);
        expand(&crate::Cli::command(), argv.chain([f.0.clone().into_os_string()]).collect())
    }

    #[test]
    fn an_optional_value_takes_a_boolean_and_a_value_may_start_with_a_dash() {
        let Sub::Serve { json, offset, name, .. } =
            run("port = 1\njson = true\noffset = -3\nname = \"-x\"\n", &[]).unwrap()
        else {
            panic!()
        };
        assert_eq!((json.as_deref(), offset, name.as_deref()), (Some("-"), Some(-3), Some("-x")));
        let Sub::Serve { json, .. } = run("port = 1\njson = false\n", &[]).unwrap() else { panic!() };
        assert_eq!(json, None);
        let Sub::Serve { json, .. } = run("port = 1\njson = \"out.json\"\n", &[]).unwrap() else { panic!() };
        assert_eq!(json.as_deref(), Some("out.json"));
    }

    #[test]
    fn a_false_flag_and_an_absent_key_leave_the_default() {
        let Sub::Serve { xps_rxqs, memory, .. } = run("port = 1\nxps-rxqs = false\n", &[]).unwrap() else { panic!() };
        assert!(!xps_rxqs);
        assert_eq!(memory, "64");
    }

    #[test]
    fn what_the_file_gets_wrong_is_named_with_the_file() {
        let err = |text: &str| format!("{:#}", run(text, &[]).unwrap_err());
        let e = err("port = 1\nthreads = 4\n");
        assert!(e.contains("`threads` is not an option of `serve`") && e.contains("port, memory-limit"), "{e}");
        let e = err("port = 1\nxps-rxqs = \"yes\"\n");
        assert!(e.contains("`xps-rxqs` takes true or false"), "{e}");
        let e = err("port = [1, 2]\n");
        assert!(e.contains("`port` takes one value, not a list"), "{e}");
        let e = err("port = 1\nverbose = 100\n");
        assert!(e.contains("`verbose` takes a count from 0 to 8"), "{e}");
        let e = err("port = 1\n[lanes]\ncount = 2\n");
        assert!(e.contains("`lanes` is not an option"), "{e}");
        let e = err("port = 1\nmemory = \n");
        assert!(e.contains("line 2, column"), "{e}");
        let e = err("port = \"eleven\"\n");
        assert!(e.contains(".toml: invalid value 'eleven' for '--port <PORT>'"), "{e}");
        let e = err("config = \"other.toml\"\n");
        assert!(e.contains("`config` is not an option"), "{e}");
        let missing = expand(
            &Cli::command(),
            ["netlane", "serve", "--config", "/nonexistent/netlane.toml"].iter().map(OsString::from).collect(),
        )
        .unwrap_err();
        assert!(format!("{missing:#}").starts_with("open /nonexistent/netlane.toml: "), "{missing:#}");
    }

    #[test]
    fn a_command_without_the_option_or_without_a_file_is_left_alone() {
        let argv: Vec<OsString> = ["netlane", "other", "--port", "3"].iter().map(OsString::from).collect();
        assert_eq!(expand(&Cli::command(), argv.clone()).unwrap(), argv);
        let argv: Vec<OsString> = ["netlane", "serve", "--port", "3"].iter().map(OsString::from).collect();
        assert_eq!(expand(&Cli::command(), argv.clone()).unwrap(), argv);
    }
}
