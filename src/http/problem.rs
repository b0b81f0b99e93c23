//! Errors at the HTTP edge, all as `application/problem+json` (RFC 9457). 5xx bodies never show
//! internals; storage unavailable is 503 with `Retry-After`.

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;

use super::PrintableJson;
use crate::domain::InvalidField;
use crate::ingest::VerifyError;
use crate::outbox::CancelError;
use crate::storage::StorageError;
use crate::support::{Refusal, SupportError};

/// One offending field of a problem.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

/// A problem+json answer (boxed: handlers return it by value in every `Err`).
#[derive(Debug, Clone)]
pub struct Problem(Box<ProblemBody>);

impl std::ops::Deref for Problem {
    type Target = ProblemBody;
    fn deref(&self) -> &ProblemBody {
        &self.0
    }
}

impl std::ops::DerefMut for Problem {
    fn deref_mut(&mut self) -> &mut ProblemBody {
        &mut self.0
    }
}

/// The body of a problem+json answer.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[schema(as = Problem)]
pub struct ProblemBody {
    /// `https://herald.dev/problems/KIND` (`validation`, `not-found`, `unauthorized`, …).
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The first offending field, for clients that look at one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
    /// The messages an ambiguous fingerprint prefix matches (identifiers only).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<crate::support::Candidate>>)]
    pub candidates: Option<serde_json::Value>,
    #[serde(skip)]
    retry_after: Option<u32>,
}

impl Problem {
    pub fn new(status: StatusCode, kind: &str, title: &str) -> Self {
        Self(Box::new(ProblemBody {
            kind: format!("https://herald.dev/problems/{kind}"),
            title: title.to_owned(),
            status: status.as_u16(),
            detail: None,
            field: None,
            errors: Vec::new(),
            candidates: None,
            retry_after: None,
        }))
    }

    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// 422 naming every invalid field.
    pub fn invalid(errors: Vec<InvalidField>) -> Self {
        let mut p = Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation",
            "The message is not valid",
        );
        p.field = errors.first().map(|e| e.field.to_owned());
        p.detail = Some(
            errors
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; "),
        );
        p.errors = errors
            .into_iter()
            .map(|e| FieldError {
                field: e.field.to_owned(),
                message: e.message,
            })
            .collect();
        p
    }

    /// 400: the body is not JSON at all.
    pub fn malformed(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "malformed",
            "The request body is not valid JSON",
        )
        .detail(detail)
    }

    pub fn not_found(what: &str) -> Self {
        Self::not_found_by(what, "id")
    }

    /// 404 naming what was looked for and by what (`no endpoint with that name`).
    pub fn not_found_by(what: &str, by: &str) -> Self {
        // A message may have been there: retention deletes finished ones (the CLI and the admin
        // page said so, the API did not; a re-check walk-through).
        let purged = if what == "message" {
            " (a finished message is deleted by retention: retention_delivered_days, \
             retention_dead_letter_days)"
        } else {
            ""
        };
        Self::new(StatusCode::NOT_FOUND, "not-found", "Not found")
            .detail(format!("no {what} with that {by}{purged}"))
    }

    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "A valid bearer token is required",
        )
    }

    /// 403: a valid token without the scope the route needs.
    pub fn forbidden(needs: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "This token's scope does not allow this",
        )
        .detail(format!("needs a token with scope {needs}"))
    }

    /// 401: a receipt whose one-time signature value (Mailgun's token) was already used for a
    /// different event.
    pub fn replayed() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "The receipt was refused; nothing was stored",
        )
        .detail("replay: its signature was already used for a different event")
    }

    pub fn unavailable() -> Self {
        let mut p = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "Storage is unavailable: send the same request again",
        );
        p.retry_after = Some(2);
        p
    }

    pub fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "Internal error; nothing was stored",
        )
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.title)
    }
}

impl ResponseError for Problem {
    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn error_response(&self) -> HttpResponse {
        let mut r = HttpResponse::build(self.status_code());
        if let Some(s) = self.retry_after {
            r.insert_header((header::RETRY_AFTER, s.to_string()));
        }
        if self.status == 408 {
            // The rest of the body may still come, or never: the connection is not reused.
            r.force_close();
        }
        if self.status == 401 && self.kind.ends_with("/unauthorized") {
            r.insert_header((header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer")));
        }
        r.printable_json_as("application/problem+json", &*self.0)
    }
}

impl From<Vec<InvalidField>> for Problem {
    fn from(errors: Vec<InvalidField>) -> Self {
        Problem::invalid(errors)
    }
}

impl From<CancelError> for Problem {
    fn from(e: CancelError) -> Self {
        match e {
            CancelError::NotFound => Problem::not_found("message"),
            CancelError::NotCancelable(_) => Problem::new(
                StatusCode::CONFLICT,
                "not-cancelable",
                "The message can no longer be canceled",
            )
            .detail(e.to_string()),
            // The API answers a fan-out's id with its messages before it cancels
            // (`fan_out_or_not_found`); this is the library's answer.
            CancelError::FanOut => {
                Problem::new(StatusCode::CONFLICT, "fan-out", "A fan-out's own event id")
                    .detail(e.to_string())
            }
            CancelError::Storage(s) => s.into(),
        }
    }
}

/// A refused receipt: 401 for authentication failures, 400 for a verified but unparsable body,
/// 503 (with Retry-After) when the verifier cannot decide now — a 4xx would make the provider
/// give up and lose the receipt.
impl From<VerifyError> for Problem {
    fn from(e: VerifyError) -> Self {
        let (status, kind, title) = match e.status() {
            // Not storage: what the check needs (a signing certificate, a subscription's
            // confirmation) cannot be had now; the provider retries.
            503 => (
                StatusCode::SERVICE_UNAVAILABLE,
                "unverifiable",
                "The receipt cannot be verified now; nothing was stored",
            ),
            400 => (
                StatusCode::BAD_REQUEST,
                "unparsable",
                "The receipt was refused; nothing was stored",
            ),
            _ => (
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "The receipt was refused; nothing was stored",
            ),
        };
        let mut p = Problem::new(status, kind, title).detail(e.to_string());
        if status == StatusCode::SERVICE_UNAVAILABLE {
            p.retry_after = Some(2);
        }
        if let VerifyError::TooLong(field) | VerifyError::Blank(field) = e {
            p.field = Some(field.clone());
        }
        p
    }
}

/// Support's answers: 404 for no message, 409 for an ambiguous prefix (listing the candidates)
/// or a state that cannot be replayed, 422 naming the field for bad input.
impl From<SupportError> for Problem {
    fn from(e: SupportError) -> Self {
        match e {
            SupportError::NotFound => Problem::not_found_by("message", "fingerprint or event id"),
            SupportError::Invalid(errors) => {
                let mut p = Problem::invalid(errors);
                p.title = "The request is not valid".into();
                p
            }
            // Several messages fit: the candidates to choose from.
            SupportError::Ambiguous(..) | SupportError::FanOut(..) => {
                let (kind, title, field) = match e {
                    SupportError::FanOut(..) => (
                        "fan-out",
                        "The event id is a fan-out's: name one of its messages",
                        "event_id",
                    ),
                    _ => (
                        "ambiguous-fingerprint",
                        "The fingerprint prefix matches several messages",
                        "fingerprint",
                    ),
                };
                let mut p = Problem::new(StatusCode::CONFLICT, kind, title).detail(e.to_string());
                p.field = Some(field.into());
                p.candidates = serde_json::to_value(e.candidates()).ok();
                p
            }
            SupportError::Refused(Refusal::WouldExpire(_)) => {
                let mut p = Problem::invalid(vec![InvalidField::new("expires_at", e.to_string())]);
                p.title = "The request is not valid".into();
                p
            }
            SupportError::Refused(ref r) => {
                let (kind, title, field) = match r {
                    Refusal::NeedsForce(_) => (
                        "force-required",
                        "A delivered message is replayed only with force",
                        Some("force"),
                    ),
                    Refusal::InFlight => ("in-flight", "The message is being sent now", None),
                    _ => ("not-replayable", "The message cannot be replayed", None),
                };
                let mut p = Problem::new(StatusCode::CONFLICT, kind, title).detail(e.to_string());
                p.field = field.map(str::to_owned);
                p
            }
            SupportError::NotSkippable(_) => Problem::new(
                StatusCode::CONFLICT,
                "not-skippable",
                "The message holds back no ordering key",
            )
            .detail(e.to_string()),
            SupportError::Moved => Problem::new(
                StatusCode::CONFLICT,
                "changed",
                "The message changed meanwhile; nothing was replayed",
            )
            .detail(e.to_string()),
            SupportError::Storage(s) => s.into(),
        }
    }
}

impl From<StorageError> for Problem {
    fn from(e: StorageError) -> Self {
        if e.is_unavailable() {
            tracing::warn!(error = %e.log_safe(), "storage unavailable");
            // Past the deadline the write goes on and may commit after this answer: said, so
            // that a client sends the same request again rather than another (it read "nothing
            // was done", and a client acting on that would send the notification twice).
            if crate::storage::group_commit::is_past_deadline(&e) {
                return Problem::unavailable().detail(
                    "the database did not confirm the write in time; it may still be stored: \
                     send the same request again (the same event id is never stored twice)",
                );
            }
            Problem::unavailable()
        } else {
            tracing::error!(error = %e.log_safe(), "storage error");
            Problem::internal()
        }
    }
}

impl From<actix_web::error::BlockingError> for Problem {
    fn from(_: actix_web::error::BlockingError) -> Self {
        // The blocking task panicked or the pool is shutting down: say so loudly, and let the
        // client retry rather than lose what it sent.
        tracing::error!("a blocking task failed (panic or shutdown)");
        Problem::unavailable()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receipt_that_cannot_be_verified_now_is_not_called_a_storage_outage() {
        let p = Problem::from(VerifyError::Unavailable("SNS signing certificate"));
        assert_eq!(
            (p.status, p.kind.as_str(), p.retry_after),
            (503, "https://herald.dev/problems/unverifiable", Some(2))
        );
        assert!(p.title.contains("cannot be verified now"), "{}", p.title);
        assert_eq!(
            p.detail.as_deref(),
            Some("verification temporarily impossible: SNS signing certificate")
        );
        assert!(Problem::unavailable().title.contains("Storage"));
    }
}
