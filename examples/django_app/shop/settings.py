"""Settings for the example shop. The database comes from DATABASE_URL
(postgresql://user:password@host:port/dbname, `?host=/socket/dir` for a
Unix socket). Django's postgresql backend uses psycopg 3 when it is
installed and psycopg2 otherwise; awa_pool accepts either."""
from __future__ import annotations

import os
from urllib.parse import parse_qs, unquote, urlsplit


def database_from_url(url: str) -> dict:
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ValueError(f"DATABASE_URL must be a postgresql:// URL, got scheme {parts.scheme!r}")
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "postgres",
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": query.pop("host", parts.hostname or ""),
        "PORT": str(parts.port or query.pop("port", "")),
        "OPTIONS": query,
    }


SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG") == "1"
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
INSTALLED_APPS = ["shop"]
MIDDLEWARE: list = []
ROOT_URLCONF = "shop.urls"
DATABASES = {"default": database_from_url(os.environ.get("DATABASE_URL", "postgresql://localhost/postgres"))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
