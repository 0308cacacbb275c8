//! Who may use the HTTP listener when tokens are on (`--auth-tokens`):
//! the same tokens as gRPC, as `Authorization: Bearer <secret>` or, for a
//! browser, a session cookie set by the `/login` form and ended by
//! `POST /logout` (sessions.rs: an opaque id, never the token). Viewing
//! needs the `read` role, POSTs (retry) need `admin`; pages show only the
//! queues the token reads. `--metrics-token-free` leaves `/metrics` open
//! to scrapers.

use std::sync::Arc;

use axum::{
    extract::{Request, State},
    http::{header, HeaderValue, Method, StatusCode},
    middleware::Next,
    response::{IntoResponse, Redirect, Response},
    Form,
};
use maud::html;
use serde::Deserialize;

use super::{layout, sessions::Full, Web};
use crate::{
    auth::{bearer, Role, Who},
    store::Store,
};

/// The session cookie's name over plain HTTP.
const COOKIE: &str = "jobq_session";

/// Its name behind TLS (`--http-behind-tls`): a browser keeps a `__Host-`
/// cookie only if it is `Secure`, has `Path=/` and no `Domain`, so no
/// other host (a sibling subdomain, a plain-HTTP server on the same name)
/// can set or receive it.
const HOST_COOKIE: &str = "__Host-jobq_session";

fn cookie_name<S>(web: &Web<S>) -> &'static str {
    if web.behind_tls {
        HOST_COOKIE
    } else {
        COOKIE
    }
}

/// The `Set-Cookie` value that keeps session `id` for `max_age` seconds
/// (an empty id and 0: the one that deletes it).
fn set_cookie<S>(web: &Web<S>, id: &str, max_age: u64) -> HeaderValue {
    let secure = if web.behind_tls { "; Secure" } else { "" };
    let value = format!(
        "{}={id}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}",
        cookie_name(web)
    );
    // The id is hex and the rest is ours: always a valid header value.
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// The session id the request's cookie names, if any.
fn session_id<'r>(req: &'r Request, name: &str) -> Option<&'r str> {
    req.headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn login_page(status: StatusCode, message: Option<&str>) -> Response {
    let body = html! {
        @if let Some(m) = message { p.error #login-error { (m) } }
        p { "This server needs a token with the " code { "read" } " role to view, "
            code { "admin" } " to retry." }
        form method="post" action="/login" {
            input #token type="password" name="token" placeholder="token" autocomplete="off";
            " "
            button type="submit" { "Log in" }
        }
    };
    let mut response = (status, layout::page("Log in", body)).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, "Bearer".parse().expect("static"));
    }
    response
}

/// The middleware in front of every route but `/login` and `/logout`:
/// names the caller (a [`Who`] in the request's extensions) or answers
/// 401/403.
pub async fn guard<S: Store>(
    State(web): State<Arc<Web<S>>>,
    mut req: Request,
    next: Next,
) -> Response {
    if !web.auth.enabled() || (web.metrics_token_free && req.uri().path() == "/metrics") {
        req.extensions_mut().insert(Who::Anyone);
        return next.run(req).await;
    }
    let header_secret = bearer(
        req.headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    )
    .map(str::to_owned);
    let (caller, by_session) = if let Some(secret) = header_secret {
        match web.auth.authenticate_secret(Some(&secret)) {
            Ok(Some(caller)) => (caller, false),
            Ok(None) => {
                req.extensions_mut().insert(Who::Anyone);
                return next.run(req).await;
            }
            Err(err) => return refused(&req, &err.to_string(), false, &web),
        }
    } else if let Some(id) = session_id(&req, cookie_name(&web)) {
        match web.sessions.lookup(id, &web.auth) {
            Some(caller) => (caller, true),
            None => {
                return refused(
                    &req,
                    "the session expired or was logged out; log in again",
                    true,
                    &web,
                )
            }
        }
    } else {
        return refused(
            &req,
            "this server needs a token: send `authorization: Bearer <secret>`",
            false,
            &web,
        );
    };
    let role = if req.method() == Method::POST {
        Role::Admin
    } else {
        Role::Read
    };
    // `/metrics` counts every queue: it takes a token that reads them all.
    let allowed = if req.uri().path() == "/metrics" {
        caller.may_everywhere(role)
    } else {
        caller.has_role(role)
    };
    if !allowed {
        let message = if req.uri().path() == "/metrics" {
            format!(
                "token {:?} lacks the {role} role on every queue (queues = [\"*\"]), which /metrics needs: it counts all queues",
                caller.name()
            )
        } else {
            format!("token {:?} lacks the {role} role", caller.name())
        };
        let render = || layout::page("Forbidden", html! { p.error { (message) } });
        let page = if by_session {
            layout::signed_in_sync(render)
        } else {
            render()
        };
        return (StatusCode::FORBIDDEN, page).into_response();
    }
    req.extensions_mut().insert(Who::Token(caller));
    if by_session {
        layout::signed_in(next.run(req)).await
    } else {
        next.run(req).await
    }
}

/// 401: the login form, or for `/metrics` a line of text. A stale session
/// cookie is deleted.
fn refused<S>(req: &Request, why: &str, stale_cookie: bool, web: &Web<S>) -> Response {
    let mut response = if req.uri().path() == "/metrics" {
        (StatusCode::UNAUTHORIZED, why.to_owned()).into_response()
    } else {
        login_page(StatusCode::UNAUTHORIZED, None)
    };
    if stale_cookie {
        response
            .headers_mut()
            .insert(header::SET_COOKIE, set_cookie(web, "", 0));
    }
    response
}

/// The login form's fields.
#[derive(Debug, Deserialize)]
pub struct LoginForm {
    token: String,
}

/// `GET /login`.
pub async fn form() -> Response {
    login_page(StatusCode::OK, None)
}

/// `POST /login`: checks the token and opens a session for it; the
/// cookie names the session, never the token.
pub async fn submit<S: Store>(
    State(web): State<Arc<Web<S>>>,
    Form(form): Form<LoginForm>,
) -> Response {
    match web.auth.authenticate_secret(Some(form.token.trim())) {
        Ok(Some(caller)) => match web.sessions.create(caller) {
            Ok(id) => {
                let mut response = Redirect::to("/").into_response();
                let max_age = web.sessions.lifetime().as_secs();
                response
                    .headers_mut()
                    .insert(header::SET_COOKIE, set_cookie(&web, &id, max_age));
                response
            }
            Err(Full) => {
                tracing::warn!(
                    sessions = web.sessions.len(),
                    "refused a dashboard login: --http-max-sessions sessions are open"
                );
                login_page(
                    StatusCode::SERVICE_UNAVAILABLE,
                    Some("too many dashboard sessions are open; try again once one expires or logs out"),
                )
            }
        },
        // Tokens are off: there is nothing to log in to.
        Ok(None) => Redirect::to("/").into_response(),
        Err(_) => login_page(StatusCode::UNAUTHORIZED, Some("unknown token")),
    }
}

/// `POST /logout`: ends the request's session, if any, and deletes its
/// cookie. Open to every caller: ending a session needs no role.
pub async fn logout<S: Store>(State(web): State<Arc<Web<S>>>, req: Request) -> Response {
    if let Some(id) = session_id(&req, cookie_name(&web)) {
        web.sessions.remove(id);
    }
    let mut response = Redirect::to("/login").into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, set_cookie(&web, "", 0));
    response
}
