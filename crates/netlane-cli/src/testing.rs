//! What the command line's unit tests share.

/// Parses the arguments the lab writes for a command (`args`, after `netlane`: the two
/// command words, then the options) as that command's `A`; a refusal fails the test
/// with the arguments and clap's message.
pub fn parse_command<A: clap::Args + clap::FromArgMatches>(args: &[String]) -> A {
    let cmd = A::augment_args(clap::Command::new(args[..2].join(" ")));
    let words = std::iter::once(args[1].as_str()).chain(args[2..].iter().map(String::as_str));
    let matches = cmd.try_get_matches_from(words).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    A::from_arg_matches(&matches).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}
