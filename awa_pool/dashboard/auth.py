"""Who may see and change what: the access token, the login cookie, CSRF
tokens, read-only mode and the security headers of every response.

Tokens are compared in constant time. The login cookie holds a value
derived from the token (never the token itself), HttpOnly and
SameSite=Strict. CSRF uses a random per-browser cookie whose value every
form echoes (double submit); a POST whose field does not match, or whose
Origin names another site, is refused.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Optional
from urllib.parse import urlsplit

from flask import Flask, Response, abort, g, redirect, request, url_for

SESSION_COOKIE = "awa_dash_session"
CSRF_COOKIE = "awa_dash_csrf"
CSRF_FIELD = "csrf_token"
OPEN_ENDPOINTS = {"static", "login", "login_post"}

# No inline script or style anywhere: every script and stylesheet is a file
# under /static. Images are the inline SVG charts.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")


def session_value(token: str) -> str:
    """What the login cookie holds: a digest of the token, not the token."""
    return hmac.new(token.encode(), b"awa-pool dashboard session", hashlib.sha256).hexdigest()


def _equal(given: Optional[str], expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def bearer_token() -> Optional[str]:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def authorized(token: Optional[str]) -> bool:
    """True without a token, or when the request carries it (header or cookie)."""
    if token is None:
        return True
    if _equal(bearer_token(), token):
        return True
    return _equal(request.cookies.get(SESSION_COOKIE), session_value(token))


def token_matches(given: Optional[str], token: str) -> bool:
    return _equal(given, token)


def safe_next(target: Optional[str]) -> str:
    """A redirect target after login: a path on this site only (relative to
    the dashboard's base path)."""
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return request.script_root + target
    return url_for("overview")


def set_session_cookie(response: Response, token: str) -> None:
    response.set_cookie(SESSION_COOKIE, session_value(token), httponly=True, samesite="Strict",
                        secure=request.is_secure, path=request.script_root or "/")


def csrf_token() -> str:
    """This browser's CSRF token (created on first use, sent as a cookie)."""
    value = request.cookies.get(CSRF_COOKIE)
    if not value or len(value) != 43:
        value = getattr(g, "new_csrf", None) or secrets.token_urlsafe(32)
        g.new_csrf = value
    return value


def _same_origin() -> bool:
    origin = request.headers.get("Origin")
    if not origin or origin == "null":
        return origin is None
    parts = urlsplit(origin)
    return parts.netloc == request.host


def check_csrf() -> None:
    """Abort with 403 unless the POST carries this browser's CSRF token."""
    cookie = request.cookies.get(CSRF_COOKIE)
    field = request.form.get(CSRF_FIELD)
    if not cookie or not _equal(field, cookie) or not _same_origin():
        abort(403, "the form's CSRF token is missing or stale: reload the page and try again")


def install(app: Flask, *, token: Optional[str], read_only: bool) -> None:
    """Register the access checks and the headers on the app."""

    @app.before_request
    def _guard() -> Optional[Response]:
        if request.endpoint not in OPEN_ENDPOINTS and not authorized(token):
            if request.method == "GET" and not request.path.startswith(("/api/", "/fragment/")):
                return redirect(url_for("login", next=request.full_path.rstrip("?")))
            abort(401, "this dashboard needs its access token")
        if request.method == "POST":
            if read_only and request.endpoint != "login_post":
                abort(403, "this dashboard is read-only: it changes nothing")
            check_csrf()
        return None

    @app.after_request
    def _headers(response: Response) -> Response:
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"
        if request.endpoint != "static":
            response.headers["Cache-Control"] = "no-store"
        new_csrf = getattr(g, "new_csrf", None)
        if new_csrf:
            response.set_cookie(CSRF_COOKIE, new_csrf, httponly=True, samesite="Strict",
                                secure=request.is_secure, path=request.script_root or "/")
        return response
