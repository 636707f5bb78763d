//! Progress bars for long runs (the command-line tool, the benchmark runner), on stderr, and
//! only when stderr is a terminal (so logs and pipes stay clean). Feature `progress`.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// A bar of `len` steps labelled `what`; hidden when stderr is not a terminal.
pub fn bar(len: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let style =
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({elapsed_precise}, eta {eta})")
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    bar.set_style(style);
    bar.set_message(what.to_string());
    bar
}

/// A spinner labelled `what` for work of unknown length (advance it with `inc` and
/// `set_message`); hidden when stderr is not a terminal.
pub fn spinner(what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let style = ProgressStyle::with_template("{spinner} {prefix}: {pos} ({elapsed_precise}) {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(style);
    bar.set_prefix(what.to_string());
    bar
}
