"""Secrets in URLs stay out of what is shown and logged."""

from __future__ import annotations

import logging

from hearth.redact import RedactFilter, redact


def test_userinfo_and_key_like_query_values_are_replaced():
    assert redact("http://bob:s3cret@10.0.0.2:8000/v1") == "http://***@10.0.0.2:8000/v1"
    assert redact("https://tok@models.example/a.gguf?token=abc&x=1") == \
        "https://***@models.example/a.gguf?token=***&x=1"
    assert redact("worker gpu (http://10.0.0.2:8000) is unreachable") == \
        "worker gpu (http://10.0.0.2:8000) is unreachable"
    assert redact("email me at bob@example.com") == "email me at bob@example.com"


def test_the_log_filter_redacts_formatted_messages():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "worker %s (%s) is down",
                               ("gpu", "http://u:pw@h:1"), None)
    RedactFilter().filter(record)
    assert record.getMessage() == "worker gpu (http://***@h:1) is down"


def test_a_remote_with_both_url_credentials_and_a_key_is_refused():
    import pytest
    from pydantic import ValidationError

    from hearth.settings import Settings

    with pytest.raises(ValidationError, match="either a user and password"):
        Settings(models=[{"name": "a"}, {"name": "b", "url": "http://u:p@h:1/v1",
                                          "api_key": "k"}])
    Settings(models=[{"name": "a"}, {"name": "b", "url": "http://u:p@h:1/v1"}])
