//! The request path for the modern MCP endpoint, phase by phase.

use std::future::{Future, Ready};
use std::pin::Pin;
use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::Either;
use tracing::Instrument;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode, header};
use mrtr_wire::protocol::meta::RequestMeta;
use serde_json::Value;

use super::admission;
use super::deps::Front;
use super::error_map;
use super::ingress::{self, Parsed};
use super::listener::ConnInfo;
use super::respond::{self, Body};
use super::{legacy_passthrough, listen, request_body};
use crate::auth::{AuthRequest, Authenticator, Principal};
use crate::caller_scope::Caller;
use crate::caller_scope::CallerScope;
use crate::config::Config;
use crate::error::{Rejection, RejectionKind};
use crate::legacy::session::SESSION_HEADER;
use crate::metrics::{Outcome, method_label};
use crate::mrtr::engine::{self, Call};
use crate::request_id::{RequestContext, RequestId};
use crate::tasks::Plan;
use crate::telemetry::spans;
use mrtr_wire::capabilities::Declared;
use mrtr_wire::protocol::methods::{Route, route};

/// Counts the outcome and writes the one access-log line of the request (in its context,
/// which carries the request id, the instance id and, for a call, the tool or prompt name or
/// resource URI as `call_target`, the round, the path and whether the call was parked), and
/// ends the exported server span the same way. Never logs payloads, states or answers.
fn record(front: &Front, method: &str, outcome: &Result<Value, Rejection>) {
    record_timed(front, method, outcome, None);
}

/// [`record`], with how long the request took (`duration_ms`) when it is known.
fn record_timed(
    front: &Front,
    method: &str,
    outcome: &Result<Value, Rejection>,
    took: Option<std::time::Duration>,
) {
    let duration_ms = took.map(|d| d.as_secs_f64() * 1000.0);
    let answered = match outcome {
        Ok(r) if r.get("resultType").and_then(Value::as_str) == Some("input_required") => {
            Outcome::InputRequired
        }
        Ok(r) if r.get("resultType").and_then(Value::as_str) == Some("task") => Outcome::Task,
        Ok(_) => Outcome::Complete,
        Err(rej) => {
            front.metrics.rejected(rej);
            Outcome::Error
        }
    };
    let kind = answered.label();
    match outcome {
        Err(rej) => {
            let row = error_map::row(rej.kind());
            spans::end_server(
                &tracing::Span::current(),
                row.status.as_u16(),
                kind,
                Some((rej.reason(), row.code)),
            );
            tracing::info!(
                method = method_label(method),
                outcome = kind,
                status = row.status.as_u16(),
                code = row.code,
                reason = rej.reason(),
                fault = rej.fault().as_str(),
                duration_ms,
                "request done"
            )
        }
        Ok(_) => {
            spans::end_server(&tracing::Span::current(), 200, kind, None);
            tracing::info!(
                method = method_label(method),
                outcome = kind,
                duration_ms,
                "request done"
            )
        }
    }
    front.metrics.answered(method, answered);
}

fn refuse(front: &Front, method: &str, id: Option<&Value>, rej: Rejection) -> Response<Body> {
    let response = respond::rejection(id, &rej);
    record(front, method, &Err(rej));
    response
}

fn accepts_sse(headers: &HeaderMap) -> bool {
    match headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) {
        None => true,
        Some(a) => a.contains("text/event-stream") || a.contains("*/*"),
    }
}

/// Whether a browser `Origin` may call the endpoint: listed in `listen.allowed_origins`, or,
/// with an empty list, a loopback origin.
fn origin_allowed(origin: &str, allowed: &[String]) -> bool {
    if !allowed.is_empty() {
        return allowed.iter().any(|a| a == origin);
    }
    url::Url::parse(origin).is_ok_and(|u| match u.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    })
}

/// Serves one HTTP request on the gateway's listener.
///
/// Not an `async fn`, and built of steps rather than one `async fn` awaiting the next: the
/// future it returns is the request's whole state, boxed once per request by the connection.
/// An `async fn` keeps what it was given for its whole life, beside the step it awaits; here
/// each step's future replaces the one before it ([`FutureExt::then`]), so the state is as
/// large as the largest step (admission, or the call's response), not the sum of them.
pub fn handle(
    front: Arc<Front>,
    req: Request<hyper::body::Incoming>,
    conn: Arc<ConnInfo>,
) -> impl Future<Output = Response<Body>> + Send + 'static {
    let cfg = front.config();
    // The request's log context (its id, the instance id, and what the engine records:
    // `call_target`, `round`, `path`, `parked`), and, while traces are exported, its span.
    let cx = RequestContext::new(RequestId::new(), front.instance_id.clone());
    let span = spans::request(&cx);
    spans::begin_server(&span, req.headers());
    // Admission's checks run at the first poll, under the request's context and span (its
    // refusals' access lines carry the request id), not when hyper calls the service.
    let admitting = {
        let front = Arc::clone(&front);
        futures_util::future::lazy(move |_| admit(front, req, conn, cfg)).flatten()
    };
    let served = admitting.then({
        let span = span.clone();
        move |admitted| match admitted {
            Err(refused) => now(refused),
            Ok(Entry::Session(request, slot)) => boxed(async move {
                let response = serve_bodyless_session(&front, request).await;
                admission::hold_until_done(response, slot)
            }),
            Ok(Entry::Post(request, slot)) => Either::Right(
                serve(front, request, span)
                    .map(move |response| admission::hold_until_done(response, slot)),
            ),
        }
    });
    cx.scope(served.instrument(span))
}

/// A response future boxed: the rare routes and hooks, kept out of the size of a call's
/// request future (a future is as large as its largest branch).
type Boxed = Pin<Box<dyn Future<Output = Response<Body>> + Send>>;

/// What a step of the request path leads to: a response ready now, a rare route's boxed
/// future, or the next step `N`.
type Next<N> = Either<Either<Ready<Response<Body>>, Boxed>, N>;

fn now<N>(response: Response<Body>) -> Next<N> {
    Either::Left(Either::Left(std::future::ready(response)))
}

fn boxed<N>(f: impl Future<Output = Response<Body>> + Send + 'static) -> Next<N> {
    Either::Left(Either::Right(Box::pin(f)))
}

/// How an admitted request goes on.
enum Entry {
    /// A POST, with the request slot it holds until its response is done.
    Post(Admitted, admission::RequestSlot),
    /// A legacy client's GET or DELETE naming a session (dual-era front), and its slot.
    Session(Admitted, admission::RequestSlot),
}

/// The phases before a request holds anything: Origin, endpoint, caller, body; then its slot.
/// Each refusal here costs the gateway no request slot, so a client that stalls or is refused
/// cannot take one from the others.
///
/// A plain function: the checks on the request's head run here, and the steps that wait
/// (authentication, the body) in a future that holds the request's head and body once (an
/// `async fn` would keep the whole request beside them).
fn admit(
    front: Arc<Front>,
    req: Request<hyper::body::Incoming>,
    conn: Arc<ConnInfo>,
    cfg: Arc<Config>,
) -> impl Future<Output = Result<Entry, Response<Body>>> + Send + 'static {
    let refused = |rej| Either::Left(std::future::ready(Err(refuse(&front, "other", None, rej))));
    // Origin: browsers send it; a page from elsewhere must not drive the user's tools.
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let ok = origin
            .to_str()
            .is_ok_and(|o| origin_allowed(o, &cfg.listen.allowed_origins));
        if !ok {
            return refused(Rejection::new(
                RejectionKind::OriginForbidden,
                "this Origin is not allowed (listen.allowed_origins)",
            ));
        }
    }

    // Phase 1: the endpoint. Only `listen.path`, only POST (2026-07-28 has no GET stream and
    // no sessions to DELETE) — except for legacy clients of the dual-era front, whose GET or
    // DELETE names a session (checked once the caller is known).
    if req.uri().path() != cfg.listen.path {
        return refused(Rejection::new(
            RejectionKind::WrongPath,
            format!("no MCP endpoint here; it is at {}", cfg.listen.path),
        ));
    }
    let bodyless_session = matches!(*req.method(), Method::GET | Method::DELETE)
        && req.headers().contains_key(SESSION_HEADER);
    if req.method() != Method::POST && !bodyless_session {
        return refused(method_not_allowed());
    }
    let (parts, body) = req.into_parts();
    Either::Right(async move {
        // Phase 2: who is calling, from the headers alone: every request is authenticated on
        // its own (there is no session), before its body is read or a slot is taken, so an
        // unauthenticated caller holds nothing and learns nothing more.
        let auth = front.auth();
        let principal = match auth
            .authenticate(AuthRequest {
                headers: &parts.headers,
                peer: conn.peer,
                client_cert_der: conn.client_cert_der.as_deref().map(Vec::as_slice),
            })
            .await
        {
            Ok(p) => p,
            Err(e) => return Err(refuse(&front, "other", None, e.into())),
        };
        let caller = Caller::of(
            principal.as_str(),
            conn.peer.ip(),
            principal.as_str() == crate::auth::ANONYMOUS,
            cfg.listen.ipv6_source_prefix,
        );

        // Phase 3: the body, within its size limit and its deadline. A late body closes the
        // connection: the rest of it must not be read as the next request.
        let bytes = if bodyless_session {
            Bytes::new()
        } else {
            match request_body::read(
                body,
                cfg.listen.max_body_bytes,
                cfg.listen.body_read_timeout,
                front.metrics.reading_body(),
            )
            .await
            {
                Ok(b) => b,
                Err(e) => {
                    if let Some(limit) = e.limit() {
                        front.limits.hit(limit);
                    }
                    if e.closes_connection() {
                        conn.close.cancel();
                    }
                    return Err(refuse(&front, "other", None, e.into()));
                }
            }
        };

        // Phase 4: a request slot, now that the request is real; held until the response
        // body is done (long-lived streams give it back once they start).
        let slot = match admission::take_slot(&front) {
            Ok(slot) => slot,
            Err(rej) => return Err(refuse(&front, "other", None, rej)),
        };
        let request = Admitted {
            parts,
            bytes,
            principal,
            caller,
            auth,
        };
        Ok(if bodyless_session {
            Entry::Session(request, slot)
        } else {
            Entry::Post(request, slot)
        })
    })
}

fn method_not_allowed() -> Rejection {
    Rejection::new(
        RejectionKind::MethodNotAllowed,
        "this MCP endpoint accepts POST only (2026-07-28 has no GET stream and no sessions)",
    )
}

/// A request that passed the front's admission: authenticated, body read, slot held.
struct Admitted {
    parts: http::request::Parts,
    bytes: Bytes,
    principal: Principal,
    caller: Caller,
    auth: Arc<Authenticator>,
}

/// Hook (dual-era front): a legacy client's GET stream or DELETE on a session this gateway
/// sealed is passed through; any other GET or DELETE is still 405.
async fn serve_bodyless_session(front: &Front, r: Admitted) -> Response<Body> {
    if !legacy_passthrough::is_session_bodyless(front, &r.parts.method, &r.parts.headers) {
        return refuse(front, "other", None, method_not_allowed());
    }
    match legacy_passthrough::serve_session(
        front,
        r.parts.method,
        &r.parts.headers,
        None,
        r.principal.as_str(),
        &r.caller,
    )
    .await
    {
        Ok(response) => response,
        Err(rej) => refuse(front, "other", None, rej),
    }
}

/// The request path for an admitted POST: the legacy-client hook, the JSON-RPC ladder,
/// routing, and serving. A plain function: it decides which future answers the request, and
/// keeps nothing of its own beside it.
fn serve(
    front: Arc<Front>,
    r: Admitted,
    span: tracing::Span,
) -> Next<impl Future<Output = Response<Body>> + Send + 'static> {
    let Admitted {
        parts,
        bytes,
        principal,
        caller,
        auth,
    } = r;
    // Hook (dual-era front): a POST on a legacy client's session goes to the legacy server
    // as it is, before modern parsing (it may be a notification, a batch, or an answer).
    if legacy_passthrough::is_session_post(&parts.headers) {
        return boxed(async move {
            match legacy_passthrough::serve_session(
                &front,
                Method::POST,
                &parts.headers,
                Some(bytes),
                principal.as_str(),
                &caller,
            )
            .await
            {
                Ok(response) => response,
                Err(rej) => refuse(&front, "other", None, rej),
            }
        });
    }

    // Phase 5: JSON-RPC envelope, then headers / version / _meta in the spec's order.
    let env = match ingress::parse_envelope(&bytes) {
        Ok(Parsed::Request(env)) => env,
        Ok(Parsed::Notification) => return now(respond::empty(StatusCode::ACCEPTED)),
        Err(refused) => {
            let (id, rej) = *refused;
            return now(refuse(&front, "other", id.as_ref(), rej));
        }
    };
    spans::name_server(
        &span,
        &parts.headers,
        method_label(&env.method),
        &env.id,
        env.params.as_ref(),
    );
    // Hook (dual-era front): a legacy `initialize` selects legacy semantics; it skips the
    // modern header ladder and opens a passed-through legacy session. One sent as a
    // 2026-07-28 request (the version in the header or in `_meta`) asks for a method that
    // revision removed: 404 + -32601, naming the versions to use instead (what a modern-only
    // server answers to `initialize`).
    if env.method == "initialize" {
        if !legacy_passthrough::is_legacy_initialize(&parts.headers, env.params.as_ref()) {
            let rej = Rejection::method_not_found(&env.method).with_data(
                serde_json::json!({"supported": mrtr_wire::protocol::SUPPORTED_VERSIONS}),
            );
            return now(refuse(&front, &env.method, Some(&env.id), rej));
        }
        return boxed(async move {
            match legacy_passthrough::serve_initialize(
                &front,
                &parts.headers,
                bytes,
                env.params.as_ref(),
                principal.as_str(),
            )
            .await
            {
                Ok(response) => {
                    record(&front, &env.method, &Ok(Value::Null));
                    response
                }
                Err(rej) => refuse(&front, &env.method, Some(&env.id), rej),
            }
        });
    }
    let meta = match ingress::validate(&parts.headers, &env) {
        Ok(m) => m,
        Err(rej) => return now(refuse(&front, &env.method, Some(&env.id), rej)),
    };

    // Phase 6: routing. Removed and unknown methods are "not found" here; a method the legacy
    // server does not offer is "not found" once the caller's own session shows it (the
    // engine checks, on the session that would serve it). Nothing is decided from another
    // caller's session.
    let route = route(&env.method);
    if route == Route::NotFound {
        let rej = Rejection::method_not_found(&env.method);
        return now(refuse(&front, &env.method, Some(&env.id), rej));
    }
    let credential = auth.credential_key(&parts.headers);
    let scope = CallerScope::new(principal.0.clone(), credential.clone());
    let routed = Routed {
        upstream_headers: upstream_headers(&parts.headers, env.params.as_ref(), &auth),
        credential,
        accepts_sse: accepts_sse(&parts.headers),
        env,
        meta,
        principal,
        caller,
        scope,
    };
    // The routes other than a call are boxed here and on the other hooks above: a future is as
    // large as its largest branch, and a call's request future is made and moved on every
    // call.
    match route {
        Route::Listen => boxed(async move { serve_listen(&front, routed).await }),
        Route::Discover => boxed(async move { serve_discover(&front, routed).await }),
        Route::Tasks => boxed(async move { serve_tasks(&front, routed).await }),
        _ => Either::Right(serve_call(front, routed, span)),
    }
}

/// A request past validation and routing: what each route's server needs of it.
struct Routed {
    env: ingress::Envelope,
    meta: RequestMeta,
    principal: Principal,
    caller: Caller,
    scope: CallerScope,
    /// Credentials and trace context for the legacy server.
    upstream_headers: HeaderMap,
    /// The digest of the forwarded credential (part of the pool key).
    credential: String,
    accepts_sse: bool,
}

/// Hook (subscriptions/listen): a long-lived stream with a legacy session of its own.
async fn serve_listen(front: &Front, r: Routed) -> Response<Body> {
    let params = r.env.params.clone().unwrap_or(Value::Null);
    let request = listen::ListenRequest {
        caller: &r.caller,
        id: &r.env.id,
        params: &params,
        accepts_sse: r.accepts_sse,
        upstream_headers: r.upstream_headers,
        scope: &r.scope,
    };
    let outcome = listen::serve(front, request).await;
    match outcome {
        Ok(response) => {
            record(front, &r.env.method, &Ok(Value::Null));
            response
        }
        Err(rej) => refuse(front, &r.env.method, Some(&r.env.id), rej),
    }
}

/// `server/discover`: the caller's own view, its session's InitializeResult, never another
/// caller's.
async fn serve_discover(front: &Front, r: Routed) -> Response<Body> {
    let outcome = crate::discover::serve(
        &front.engine,
        &r.scope,
        &Declared::from_modern(&r.meta.client_capabilities),
        r.upstream_headers,
        listen::supported(&front.sessions.upstream()),
    )
    .await;
    answer(front, &r.env.method, &r.env.id, outcome, None)
}

/// A request answered with one JSON body: its result, or the error its rejection maps to;
/// recorded either way (`took`: how long it took, when known).
fn answer(
    front: &Front,
    method: &str,
    id: &Value,
    outcome: Result<Value, Rejection>,
    took: Option<std::time::Duration>,
) -> Response<Body> {
    match outcome {
        Ok(result) => {
            let response = respond::json(
                StatusCode::OK,
                &mrtr_wire::jsonrpc::OutgoingResult::new(id, &result),
            );
            record_timed(front, method, &Ok(result), took);
            response
        }
        Err(rej) => refuse(front, method, Some(id), rej),
    }
}

/// `tasks/get`, `tasks/update`, `tasks/cancel`: answered from this replica's tasks.
async fn serve_tasks(front: &Front, r: Routed) -> Response<Body> {
    let outcome = if front.config().tasks.enabled {
        let params = r.env.params.clone().unwrap_or(Value::Null);
        front
            .tasks
            .serve(
                &front.engine,
                &r.env.method,
                &params,
                r.principal.as_str(),
                error_map::status_and_error,
            )
            .await
    } else {
        Err(Rejection::method_not_found(&r.env.method))
    };
    answer(front, &r.env.method, &r.env.id, outcome, None)
}

/// Phase 7: serve through a legacy session in the engine's own task; stream notifications if
/// any come before the result. A plain function, as [`serve`].
fn serve_call(
    front: Arc<Front>,
    r: Routed,
    span: tracing::Span,
) -> Next<impl Future<Output = Response<Body>> + Send + 'static> {
    let started = std::time::Instant::now();
    let Routed { env, meta, .. } = r;
    let call = Call {
        id: env.id.clone(),
        method: env.method.clone(),
        params: env
            .params
            .unwrap_or_else(|| Value::Object(Default::default())),
        meta,
        principal: r.principal.0,
        caller: r.caller,
        upstream_headers: r.upstream_headers,
        credential: r.credential,
    };
    if let Some(target) = call.target() {
        spans::call_target(&span, &call.method, target);
    }
    // A tool call may become a task: answered now, run on in a task of its own.
    match front.tasks.plan(&front.config(), &call) {
        Err(rej) => return now(refuse(&front, &env.method, Some(&env.id), rej)),
        Ok(Plan::Task) => {
            return boxed(async move {
                let created = front
                    .tasks
                    .create(&front.engine, call, error_map::status_and_error)
                    .await;
                answer(
                    &front,
                    &env.method,
                    &env.id,
                    created,
                    Some(started.elapsed()),
                )
            });
        }
        Ok(Plan::Call) => {}
    }
    // Only a tool list teaches anything (see `Tasks::learn`): no key built for other calls.
    let lists_tools = (call.method == "tools/list").then(|| crate::tasks::tools_key(&call));
    // Shared with a long call's work, which may outlive this request.
    let call = Arc::new(call);
    let runtime = front.engine.clone();
    let method = env.method;
    let work_span = span.clone();
    Either::Right(respond::run(
        env.id,
        r.accepts_sse,
        move |sink, cancel| {
            async move {
                engine::serve(&runtime, &call, &sink, &cancel, error_map::status_and_error).await
            }
            .instrument(work_span)
        },
        move |outcome| {
            // A tool list tells which tools the legacy server runs as tasks (to this caller).
            if let (Some(scope), Ok(list)) = (&lists_tools, outcome) {
                front.tasks.learn(scope, list);
            }
            // The last frame of a streamed answer is written outside this task: its access
            // line needs the span (`run` restores the request's context).
            span.in_scope(|| record_timed(&front, &method, outcome, Some(started.elapsed())))
        },
    ))
}

/// Headers passed on to the legacy server: the credentials `[auth] upstream_credentials`
/// asks for, and W3C trace context.
/// Trace context comes from the HTTP headers, or else from `params._meta` (where 2026-07-28
/// clients may put it); legacy servers read it from either place.
pub(super) fn upstream_headers(
    h: &HeaderMap,
    params: Option<&Value>,
    auth: &Authenticator,
) -> HeaderMap {
    let mut out = auth.upstream_headers(h);
    for name in ["traceparent", "tracestate", "baggage"] {
        let value = h.get(name).cloned().or_else(|| {
            params
                .and_then(|p| p.get("_meta"))
                .and_then(|m| m.get(name))
                .and_then(Value::as_str)
                .and_then(|s| http::HeaderValue::from_str(s).ok())
        });
        if let Some(v) = value {
            out.insert(http::HeaderName::from_static(name), v);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::future_size;

    #[test]
    fn a_requests_future_is_as_large_as_its_largest_step() {
        // What `handle` returns is what every request boxes: admission, then the call's
        // response, one replacing the other. As `async fn`s awaiting one another, each step
        // kept its arguments beside the next: 3,848 bytes (release build) where the largest
        // step was 1,264 (872 and 760 now).
        let request = future_size::returned3(handle);
        let admission = future_size::returned4(admit);
        let call = future_size::returned3(serve);
        // Admission holds the request's head and body once while it authenticates: as an
        // `async fn` it kept the whole request twice (1,264 bytes against 760).
        let http_request = std::mem::size_of::<Request<hyper::body::Incoming>>();
        let authenticate = future_size::returned2(Authenticator::authenticate);
        assert!(
            admission < 2 * http_request + authenticate,
            "admission is {admission} bytes, for a {http_request}-byte request and a \
             {authenticate}-byte authentication"
        );
        assert!(
            request <= admission.max(call) + 128,
            "a request's future is {request} bytes; its steps are {admission} and {call}"
        );
        // The call's step is its response's future and nothing of the request beside it: an
        // `async fn` `serve` or `serve_call` keeps the admitted (or routed) request twice
        // around that future.
        let call_step = future_size::returned3(serve_call);
        let routed = std::mem::size_of::<Routed>();
        assert!(
            call <= call_step + 16,
            "serving a call is {call} bytes around a {call_step}-byte call step"
        );
        assert!(
            call_step <= routed + 256,
            "a call step is {call_step} bytes for a {routed}-byte routed request"
        );
    }
}
