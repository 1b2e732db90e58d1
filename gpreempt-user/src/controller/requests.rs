//! The one way a running controller answers a request on its socket, whoever the controller is
//! (`run`, a `suspend` holder, `top` after an `s` key): through the backend seam, never the
//! vendor control directly.

use crate::{
    backend::Backends,
    controller::daemon::{Request, Response, Status},
    model::State,
    outcome::OpReport,
};

/// A request's answer, and what was done (for the caller's model, audit and status).
pub struct Answer {
    pub response: Response,
    /// The report of a suspend (`true`) or resume (`false`) that reached the driver.
    pub acted: Option<(OpReport, bool)>,
}

/// Serves `req` with the backend of the target's vendor; `status` is asked only for a status
/// request.
pub async fn answer(
    backends: &mut Backends,
    state: &State,
    req: Request,
    status: impl FnOnce() -> Status,
) -> Answer {
    let (suspend, pid, r) = match req {
        Request::Status => {
            return Answer {
                response: Response {
                    ok: true,
                    status: Some(status()),
                    ..Default::default()
                },
                acted: None,
            }
        }
        Request::Suspend { pid, queues, grace } => {
            let r = match backends.for_pid(state, pid) {
                Ok(b) => b.suspend(state, pid, queues, grace).await,
                Err(e) => Err(e),
            };
            (true, pid, r)
        }
        Request::Resume { pid, queues } => {
            let r = match backends.for_pid(state, pid) {
                Ok(b) => b.resume(state, pid, queues).await,
                Err(e) => Err(e),
            };
            (false, pid, r)
        }
    };
    match r {
        Ok(report) => Answer {
            response: Response {
                ok: true,
                report: Some(report.clone()),
                ..Default::default()
            },
            acted: Some((report, suspend)),
        },
        Err(e) => Answer {
            response: Response::err(format!("pid {pid}: {e}")),
            acted: None,
        },
    }
}
