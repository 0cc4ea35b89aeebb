"""Redaction: secrets in argv, environments and free text are masked; ordinary vLLM output is not."""

from soakmatrix.matrix.contracts.redact import (
    MASK,
    redact_argv,
    redact_env,
    redact_text,
    redact_url,
    scrub,
    secret_values,
    url_secrets,
)

KEY = "sk-proj-abcdefghijklmnopqrstuvwx"
HF = "hf_abcdefghijklmnopqrstuvwxyz"


def test_secret_options_lose_their_values_in_both_spellings():
    argv = ["vllm", "serve", "m", "--api-key", KEY, "--hf-token=" + HF, "--max-num-seqs", "8"]
    assert redact_argv(argv) == ["vllm", "serve", "m", "--api-key", MASK, f"--hf-token={MASK}", "--max-num-seqs", "8"]


def test_token_shapes_are_masked_anywhere():
    for token in (KEY, HF, "ghp_" + "a" * 36, "glpat-" + "b" * 20, "AKIAABCDEFGHIJKLMNOP",
                  "xoxb-1234567890-abcdef", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJlZ29lc2hlcmU"):
        out = redact_text(f"prefix {token} suffix")
        assert token not in out and out == f"prefix {MASK} suffix", token


def test_authorization_headers_and_secret_env_assignments():
    text = ('Authorization: Bearer opaque-value-123\n{"authorization": "Basic dXNlcjpwYXNz"}\n'
            "HF_TOKEN=whatever OPENAI_API_KEY='k-123' AWS_SECRET_ACCESS_KEY=abc/def")
    out = redact_text(text)
    for secret in ("opaque-value-123", "dXNlcjpwYXNz", "whatever", "k-123", "abc/def"):
        assert secret not in out
    assert "Authorization: Bearer [redacted]" in out


def test_vllm_log_lines_stay_readable():
    line = ("INFO [core.py:1] max_num_batched_tokens=8192, tokenizer=x, max_tokens: 16, "
            "MAX_TOKENS=3 VLLM_TOKENIZER=y --max-model-len 4096 key=value "
            "# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.")
    assert redact_text(line) == line


def test_environment_values_of_secret_names():
    env = {"HF_TOKEN": HF, "VLLM_TOKENIZER": "x", "OPENAI_API_KEY": "plain", "NOTE": f"uses {KEY}"}
    assert redact_env(env) == {"HF_TOKEN": MASK, "VLLM_TOKENIZER": "x", "OPENAI_API_KEY": MASK, "NOTE": f"uses {MASK}"}


def test_literal_secrets_are_scrubbed_even_without_a_known_shape():
    secrets = secret_values(["--api-key", "my-own-secret-1"], {"DB_PASSWORD": "hunter22"})
    assert set(secrets) == {"my-own-secret-1", "hunter22"}
    out = scrub("server echoed my-own-secret-1 and hunter22", secrets)
    assert "my-own-secret-1" not in out and "hunter22" not in out


def test_url_passwords_and_secret_query_parameters():
    assert redact_text("watching http://admin:hunter22@10.0.0.5:8000 now") == f"watching http://admin:{MASK}@10.0.0.5:8000 now"
    assert redact_text("https://h/x?api_key=abc123&model=m&access_token=t0k") == f"https://h/x?api_key={MASK}&model=m&access_token={MASK}"
    for plain in ("http://127.0.0.1:8000/metrics", "ssh user@host", "at 12:30:45 user@host", "https://h/x?model=m&max_tokens=4"):
        assert redact_text(plain) == plain


def test_url_credentials_and_query_tokens_are_masked_and_the_rest_stays():
    cases = {
        "http://admin:hunter22@10.0.0.5:8000/v1": f"http://admin:{MASK}@10.0.0.5:8000/v1",
        "https://ghp_tokenasuser@github.com/org/repo": f"https://{MASK}@github.com/org/repo",
        "http://h:8000/v1/models?api_key=k123&model=m&access_token=t456":
            f"http://h:8000/v1/models?api_key={MASK}&model=m&access_token={MASK}",
        "ray://user:pa%40ss@head:10001": f"ray://user:{MASK}@head:10001",
        "vllm @ git+https://ci:tok123@git.example.org/vllm.git@abc123":
            f"vllm @ git+https://ci:{MASK}@git.example.org/vllm.git@abc123",
    }
    for url, want in cases.items():
        assert redact_url(url) == want, url
    for plain in ("vllm @ git+https://github.com/vllm-project/vllm@abc123", "http://[::1]:8000/metrics",
                  "http://127.0.0.1:8000/v1/completions?stream=true", "ray://10.0.0.1:10001"):
        assert redact_url(plain) == plain


def test_url_secrets_find_the_literal_values_to_scrub_elsewhere():
    assert url_secrets("http://u:pa%40ssword@h/?token=abcdef") == sorted(["pa%40ssword", "pa@ssword", "abcdef"])
    secrets = secret_values(["watch", "http://u:longpassword@h:1"])
    assert scrub("the server said longpassword", secrets) == f"the server said {MASK}"
