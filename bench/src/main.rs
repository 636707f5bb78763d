//! `kbench`: the benchmark runner and the main job. Work in progress: see the README.
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    eprintln!("kbench {args:?}: not implemented yet");
    std::process::exit(2);
}
