"""A logger held at another level for a block: vLLM's chatter while its parser checks flags, Ray's
wrong note while our cluster starts; put back afterwards, also when the block raises."""

from __future__ import annotations

import logging

import pytest

from soakmatrix.matrix.logger_level import logger_level


def test_the_level_holds_inside_and_comes_back_after_an_error(caplog):
    logger = logging.getLogger("vllm.test_logger_level")
    logger.setLevel(logging.INFO)
    with pytest.raises(ValueError), logger_level("vllm.test_logger_level", logging.CRITICAL):
        logger.warning("the parser's chatter")
        raise ValueError("rejected flag")
    logger.warning("after the block")
    assert [r.getMessage() for r in caplog.records if r.name == "vllm.test_logger_level"] == ["after the block"]
    assert logger.level == logging.INFO
