//! The one way a running controller answers a request on its socket, whoever the controller is
//! (`run`, a `suspend` holder, `top` after an `s` key): through the backend seam, never the
//! vendor control directly. Queue ids a user names are checked first: nothing reaches a driver
//! for an id that is not a live queue of that process.

use crate::{
    backend::{ActError, Acted, Backends, Ticket},
    controller::daemon::{Request, Response, Status},
    observe::model::State,
    outcome::OpReport,
};

pub use crate::backend::queue_ids::check_queues;

/// A request's answer, and what was done (for the caller's model, audit and status).
pub struct Answer {
    pub response: Response,
    /// The report of a suspend (`true`) or resume (`false`) that reached the driver.
    pub acted: Option<(OpReport, bool)>,
}

/// Answered now, or once a backend's worker is done ([`finish`] it then).
pub enum Answered {
    Now(Box<Answer>),
    Later {
        ticket: Ticket,
        pid: u32,
        suspend: bool,
    },
}

impl Answered {
    /// For a controller whose backends all act at once (KFD only: `suspend`, `top`).
    pub fn now(self) -> Answer {
        match self {
            Self::Now(a) => *a,
            Self::Later {
                ticket,
                pid,
                suspend,
            } => finish(pid, suspend, Acted::Later(ticket).now()),
        }
    }
}

/// Serves `req` with the backend of the target's vendor; `status` is asked only for a status
/// request.
pub async fn answer(
    backends: &mut Backends,
    state: &State,
    req: Request,
    status: impl FnOnce() -> Status,
) -> Answered {
    let (suspend, pid, r) = match req {
        Request::Status => {
            return Answered::Now(Box::new(Answer {
                response: Response {
                    ok: true,
                    status: Some(status()),
                    ..Default::default()
                },
                acted: None,
            }))
        }
        Request::Suspend { pid, queues, grace } => {
            if let Some(e) = refuse(state, pid, &queues) {
                return Answered::Now(Box::new(e));
            }
            let r = match backends.for_pid(state, pid) {
                Ok(b) => b.suspend(state, pid, queues, grace).await,
                Err(e) => Acted::Now(Err(e)),
            };
            (true, pid, r)
        }
        Request::Resume { pid, queues } => {
            if let Some(e) = refuse(state, pid, &queues) {
                return Answered::Now(Box::new(e));
            }
            let r = match backends.for_pid(state, pid) {
                Ok(b) => b.resume(state, pid, queues).await,
                Err(e) => Acted::Now(Err(e)),
            };
            (false, pid, r)
        }
    };
    match r {
        Acted::Now(r) => Answered::Now(Box::new(finish(pid, suspend, r))),
        Acted::Later(ticket) => Answered::Later {
            ticket,
            pid,
            suspend,
        },
    }
}

/// The answer to a suspend (`suspend`) or resume of `pid` that came to `r`.
pub fn finish(pid: u32, suspend: bool, r: Result<OpReport, ActError>) -> Answer {
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

/// The answer to a request naming a queue `pid` does not have (None: go ahead).
fn refuse(state: &State, pid: u32, queues: &Option<Vec<u32>>) -> Option<Answer> {
    let ids = queues.as_deref()?;
    crate::backend::queue_ids::check(state, pid, ids)
        .err()
        .map(|e| Answer {
            response: Response::err(format!("pid {pid}: {e}")),
            acted: None,
        })
}
