use std::process::ExitCode;

fn main() -> ExitCode {
    match gpreempt_user::cli::main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpreempt-ebpf: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
