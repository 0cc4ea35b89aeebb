"""Secrets never reach an artifact: what redaction means for argv, environments and free text.

A model's `args` may carry `--api-key sk-...`, an engine's environment `HF_TOKEN`, a log line an
`Authorization: Bearer ...` header, a URL `https://user:password@host/?api_key=...`, and py-spy
prints every process's command line. Everything we
write (command files, logs, evidence, JUnit, the history store, the dashboard, `plan`'s output)
passes through here first. The patterns are plain data (`SECRET_OPTION`, `SECRET_ENV_NAME`,
`TOKEN_SHAPES`) so a test or a user can add one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

MASK = "[redacted]"

# `--api-key X`, `--hf-token=X`, `--db-password X`: options whose value is a secret
SECRET_OPTION = re.compile(
    r"^--?[A-Za-z0-9_-]*(?:api[-_]?key|token|secret|passw(?:or)?d|credential)[A-Za-z0-9_-]*$", re.I
)
# environment variables named like a secret (HF_TOKEN, OPENAI_API_KEY, AWS_SECRET_ACCESS_KEY): the
# word as a whole component of the name, so MAX_TOKENS or VLLM_TOKENIZER stay readable
SECRET_ENV_NAME = re.compile(r"(?:^|_)(?:TOKEN|KEY|SECRET|PASSW(?:OR)?D|CREDENTIALS?|AUTH)(?:_|$)", re.I)
# known shapes of tokens, wherever they appear
TOKEN_SHAPES: list[re.Pattern] = [
    re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}"),  # OpenAI / Anthropic style
    re.compile(r"\bhf_[A-Za-z0-9]{20,}"),  # Hugging Face
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}"),  # GitHub
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{40,}"),
    re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}"),  # GitLab
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),  # Slack
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),  # AWS access key id
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),  # JWT
]
# `Authorization: Bearer X`, `"authorization": "Basic X"`, `Proxy-Authorization: X`
AUTH_HEADER = re.compile(
    r"(?i)(\b(?:proxy-)?authorization\b[\"']?\s*[:=]\s*[\"']?)(?:(bearer|basic|token)\s+)?"
    r"[^\s\"',;}]+"
)
# `NAME=value` in text (an environment dump, a shell line) where NAME is an upper-case secret's name
ENV_ASSIGNMENT = re.compile(r"\b([A-Z_][A-Z0-9_]*)(=)([\"']?)([^\s\"']+)")
# `scheme://user:password@host` and `scheme://TOKEN@host`: the password, or a lone user part (a token
# is often given as the user), is masked; a path's `@` (`git+https://host/org/repo@sha`) is not userinfo
URL_USERINFO = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://)([^\s/?#@:'\"]*)(?::([^\s/?#@'\"]*))?@")
# `?api_key=X`, `&token=X`, `&sig=X` in a URL's query (the secret word a whole part of the name, so
# `max_tokens=4` stays readable)
QUERY_SECRET = re.compile(
    r"(?i)([?&;](?:[a-z0-9]+[_.-])*(?:api[-_]?key|key|token|secret|passw(?:or)?d|credentials?|auth"
    r"|sig|signature|code)(?:[_.-][a-z0-9]+)*=)([^&#\s\"'<>]+)"
)
# `--api-key X` / `--api-key=X` inside a command line written as text
OPTION_IN_TEXT = re.compile(
    r"(?<![\w-])(--?[A-Za-z0-9_-]*(?:api[-_]?key|token|secret|passw(?:or)?d|credential)"
    r"[A-Za-z0-9_-]*)(=|\s+)(['\"]?)([^\s'\"]+)",
    re.I,
)


def redact_text(text: str) -> str:
    """`text` with every secret it shows replaced by `[redacted]`."""
    if not text:
        return text
    for shape in TOKEN_SHAPES:
        text = shape.sub(MASK, text)
    text = URL_USERINFO.sub(_userinfo, text)
    text = QUERY_SECRET.sub(lambda m: m.group(1) + (m.group(2) if m.group(2) == MASK else MASK), text)
    text = AUTH_HEADER.sub(lambda m: m.group(1) + (m.group(2) + " " if m.group(2) else "") + MASK, text)
    text = OPTION_IN_TEXT.sub(lambda m: m.group(1) + m.group(2) + m.group(3) + MASK, text)
    return ENV_ASSIGNMENT.sub(_env_assignment, text)


def _userinfo(m: re.Match) -> str:
    scheme, user, password = m.groups()
    if password is not None:
        return f"{scheme}{user}:{MASK}@"
    return f"{scheme}{MASK}@" if user and user != MASK else m.group(0)


def redact_url(url: str) -> str:
    """A URL fit to print or store: its password (or lone user token) and secret query values masked."""
    return redact_text(url)


def url_secrets(url: str) -> list[str]:
    """The literal secrets of one URL (its password or lone user part, secret query values), for
    `scrub` where the URL may appear re-encoded or cut up."""
    import urllib.parse

    found: list[str] = []
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.password:
            found += [parts.password, urllib.parse.unquote(parts.password)]
        elif parts.username:
            found.append(parts.username)
    except ValueError:
        pass
    found += [m.group(2) for m in QUERY_SECRET.finditer(url)]
    return sorted({s for s in found if len(s) >= 4})


def _env_assignment(m: re.Match) -> str:
    name, sep, quote, value = m.groups()
    if value == MASK or not SECRET_ENV_NAME.search(name):
        return m.group(0)
    return f"{name}{sep}{quote}{MASK}"


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line with the values of secret options (and any token-shaped word) masked."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        arg = str(arg)
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        option, eq, _ = arg.partition("=")
        if SECRET_OPTION.match(option):
            if eq:
                out.append(f"{option}={MASK}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact_text(arg))
    return out


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """An environment with secret-named variables' values masked (and tokens anywhere else)."""
    return {k: (MASK if SECRET_ENV_NAME.search(k) else redact_text(str(v))) for k, v in env.items()}


def secret_values(argv: Iterable[str] = (), env: Mapping[str, str] | None = None) -> list[str]:
    """The literal secrets in an argv and environment, for scrubbing text no pattern would recognise
    (a server echoing its own `--api-key` value in a log line)."""
    found: list[str] = []
    argv = [str(a) for a in argv]
    for word in (w for arg in argv for w in arg.split() if "://" in w):
        found += url_secrets(word)
    for i, arg in enumerate(argv):
        option, eq, value = arg.partition("=")
        if SECRET_OPTION.match(option):
            secret = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if len(secret) >= 4:
                found.append(secret)
    for k, v in (env or {}).items():
        if SECRET_ENV_NAME.search(k) and len(str(v)) >= 4:
            found.append(str(v))
    return found


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """`redact_text`, plus every literal in `secrets` masked wherever it appears."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return redact_text(text)
