//! `better-compute`: the control-plane server and the operator CLI.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    better_compute::cli::main()
}
