//! Who may use the HTTP listener when tokens are on (`--auth-tokens`):
//! the same tokens as gRPC, as `Authorization: Bearer <secret>` or, for a
//! browser, an HttpOnly cookie set by the `/login` form. Viewing needs the
//! `read` role, POSTs (retry) need `admin`; pages show only the queues the
//! token reads. `--metrics-token-free` leaves `/metrics` open to scrapers.

use std::sync::Arc;

use axum::{
    extract::{Request, State},
    http::{header, Method, StatusCode},
    middleware::Next,
    response::{IntoResponse, Redirect, Response},
    Form,
};
use maud::html;
use serde::Deserialize;

use super::{layout, Web};
use crate::{
    auth::{bearer, Role, Who},
    store::Store,
};

/// The cookie that carries the secret for a browser.
const COOKIE: &str = "jobq_token";

/// The secret a request presents: the bearer header, else the cookie.
fn presented(req: &Request) -> Option<String> {
    let headers = req.headers();
    if let Some(secret) = bearer(
        headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    ) {
        return Some(secret.to_owned());
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_owned())
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

/// The middleware in front of every route but `/login`: names the caller
/// (a [`Who`] in the request's extensions) or answers 401/403.
pub async fn guard<S: Store>(
    State(web): State<Arc<Web<S>>>,
    mut req: Request,
    next: Next,
) -> Response {
    if !web.auth.enabled() || (web.metrics_token_free && req.uri().path() == "/metrics") {
        req.extensions_mut().insert(Who::Anyone);
        return next.run(req).await;
    }
    let caller = match web.auth.authenticate_secret(presented(&req).as_deref()) {
        Ok(Some(caller)) => caller,
        Ok(None) => {
            req.extensions_mut().insert(Who::Anyone);
            return next.run(req).await;
        }
        Err(err) => {
            if req.uri().path() == "/metrics" {
                return (StatusCode::UNAUTHORIZED, err.to_string()).into_response();
            }
            return login_page(StatusCode::UNAUTHORIZED, None);
        }
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
        return (
            StatusCode::FORBIDDEN,
            layout::page("Forbidden", html! { p.error { (message) } }),
        )
            .into_response();
    }
    req.extensions_mut().insert(Who::Token(caller));
    next.run(req).await
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

/// `POST /login`: checks the token, keeps it in an HttpOnly cookie.
pub async fn submit<S: Store>(
    State(web): State<Arc<Web<S>>>,
    Form(form): Form<LoginForm>,
) -> Response {
    let secret = form.token.trim();
    let cookie_safe = secret
        .bytes()
        .all(|b| b.is_ascii_graphic() && !matches!(b, b';' | b',' | b'"' | b'\\'));
    match web.auth.authenticate_secret(Some(secret)) {
        Ok(_) if cookie_safe => {
            let cookie = format!("{COOKIE}={secret}; HttpOnly; SameSite=Strict; Path=/");
            let mut response = Redirect::to("/").into_response();
            match cookie.parse() {
                Ok(value) => {
                    response.headers_mut().insert(header::SET_COOKIE, value);
                    response
                }
                Err(_) => login_page(
                    StatusCode::BAD_REQUEST,
                    Some("this token cannot be kept in a cookie; use the Authorization header"),
                ),
            }
        }
        Ok(_) => login_page(
            StatusCode::BAD_REQUEST,
            Some("this token cannot be kept in a cookie; use the Authorization header"),
        ),
        Err(_) => login_page(StatusCode::UNAUTHORIZED, Some("unknown token")),
    }
}
