"""The watch's decisions on scripted series: no false alarm on the cases operators live with, a verdict
in seconds on a hang, one incident per episode, `down` for a refused connection."""

from __future__ import annotations

from soakmatrix.jobs.detect.protocol import MetricsSample, StreamState, Tick
from soakmatrix.jobs.watch.detectors import build_watch_detectors
from soakmatrix.jobs.watch.loop import LoopConfig, Observation, WatchLoop


class Script:
    """A fake server seen every 0.5 s: counters, gauges, a canary that answers (or not)."""

    def __init__(self, every: float = 5.0) -> None:
        self.loop = WatchLoop(build_watch_detectors, LoopConfig(canary_every_s=every))
        self.now = 1000.0
        self.gen = self.prompt = self.steps = 0.0
        self.running = self.waiting = 0.0
        self.canary_open_since: float | None = None
        self.canary_answers = True
        self.canary_last_token: float | None = None
        self.canary_tokens = 0
        self.canaries = 0
        self.steps_log = []
        self.verdicts = []

    def advance(self, seconds: float, *, scrape: bool = True, refused: bool = False, health: int | None = 200,
                log: tuple[str, ...] = (), scrape_error: str | None = None) -> None:
        end = self.now + seconds
        while self.now < end:
            self.now += 0.5
            if self.canary_open_since is not None and self.canary_answers and self.now - self.canary_open_since >= 0.5:
                self.canary_last_token, self.canary_tokens = self.now, self.canary_tokens + 4
                self.gen += 4
                self.canary_open_since = None
            metrics = None
            if scrape and not refused:
                metrics = MetricsSample(at=self.now, generation_tokens=self.gen, prompt_tokens=self.prompt,
                                        running=self.running, waiting=self.waiting, steps=self.steps)
            stream = StreamState(at=self.now, open_streams=1 if self.canary_open_since is not None else 0,
                                 last_token_at=self.canary_last_token,
                                 oldest_waiting_first_token_since=self.canary_open_since, tokens=self.canary_tokens)
            err = "/metrics: ConnectionRefusedError" if refused else scrape_error
            tick = Tick(now=self.now, metrics=metrics, stream=stream, log_lines=log, scrape_error=err)
            log = ()
            step = self.loop.step(Observation(tick, health=None if refused else health))
            self.steps_log.append(step)
            if step.abort_canary:
                self.canary_open_since = None
            if step.verdict:
                self.verdicts.append(step.verdict)
            if step.send_canary:
                self.canaries += 1
                self.canary_open_since = self.now

    def traffic(self, seconds: float, running: float = 4, tokens_per_s: float = 100) -> None:
        end = self.now + seconds
        self.running = running
        while self.now < end:
            self.gen += tokens_per_s * 0.5
            self.steps += 1
            self.advance(0.5)

    @property
    def state(self) -> str:
        return self.steps_log[-1].state


def test_idle_server_gets_canaries_and_no_alarm():
    s = Script()
    s.advance(600)
    assert s.verdicts == [] and s.state == "idle"
    assert 100 <= s.canaries <= 130   # one every ~5 s of no progress


def test_busy_server_with_moving_counters_needs_no_canary():
    s = Script()
    s.advance(1)
    s.traffic(120)
    assert s.verdicts == [] and s.canaries <= 1 and s.state == "busy"


def test_hang_under_load_is_caught_in_seconds_and_once():
    s = Script()
    s.advance(1)
    s.traffic(30)
    hang_at = s.now
    s.canary_answers = False
    s.advance(120)       # counters frozen, running stays 4
    assert len(s.verdicts) == 1
    v = s.verdicts[0]
    assert v.detector == "passive_progress" and 6.0 <= v.at - hang_at <= 8.0
    assert s.state == "hung"


def test_hang_while_idle_is_caught_by_the_canary():
    s = Script()
    s.advance(20)
    s.canary_answers = False
    hang_at = s.now
    s.advance(60)
    assert len(s.verdicts) == 1 and s.verdicts[0].detector == "canary"
    assert s.verdicts[0].at - hang_at <= 5.0 + 7.0


def test_recovery_ends_the_episode_and_a_second_hang_is_a_second_incident():
    s = Script()
    s.advance(1)
    s.traffic(10)
    s.canary_answers = False
    s.advance(20)
    assert len(s.verdicts) == 1
    s.canary_answers = True
    s.traffic(20)
    assert s.state == "busy"
    s.canary_answers = False
    s.advance(20)
    assert len(s.verdicts) == 2


def test_queueing_with_nothing_running_is_not_a_hang_when_the_canary_answers():
    s = Script()
    s.advance(1)
    s.waiting, s.running = 12, 0
    s.advance(300)
    assert s.verdicts == [] and s.state == "busy" and s.canaries >= 50


def test_queueing_with_nothing_running_and_a_silent_canary_is_a_hang():
    s = Script()
    s.advance(1)
    s.waiting, s.running = 12, 0
    s.canary_answers = False
    s.advance(60)
    assert [v.detector for v in s.verdicts] == ["canary"]


def test_restart_is_down_then_up_never_hung():
    s = Script()
    s.advance(1)
    s.traffic(20)
    s.advance(15, refused=True)
    assert s.state == "down" and s.verdicts == []
    s.gen = s.prompt = s.steps = 0        # the new server counts from zero
    s.running = 0
    s.advance(30)
    assert s.verdicts == [] and s.state == "idle"
    assert any(st.note and "back after down" in st.note for st in s.steps_log)


def test_a_scrape_that_times_out_once_is_no_information():
    s = Script()
    s.advance(1)
    s.traffic(10)
    s.advance(5, scrape=False, scrape_error="/metrics: TimeoutError")
    s.traffic(30)
    assert s.verdicts == []


def test_long_prefill_chunks_are_learned_not_alarmed():
    s = Script()
    s.advance(1)
    s.traffic(20)               # ordinary traffic first: short gaps
    s.running = 1
    for step_s in [3.1, 4.1, 5.2, 6.3, 7.3, 8.4, 9.4, 10.5, 11.5, 12.6, 13.7, 14.3]:   # a 100k-token prefill
        s.advance(step_s)
        s.steps += 1
        s.prompt += 0          # prompt tokens are counted at the end
    s.gen += 1
    s.prompt += 100_000
    s.advance(1)
    assert s.verdicts == []


def test_bare_engine_dead_line_followed_by_a_stop_is_a_shutdown():
    s = Script()
    s.advance(3)
    s.advance(0.5, log=("ERROR AsyncLLM output_handler failed. vllm.v1.engine.exceptions.EngineDeadError: x",))
    s.advance(5, refused=True)
    assert s.verdicts == [] and s.state == "down"
    assert any(st.note and "a shutdown" in st.note for st in s.steps_log)


def test_fatal_error_line_is_a_crash_at_once():
    s = Script()
    s.advance(3)
    s.advance(0.5, log=("ERROR EngineCore encountered a fatal error.",))
    assert [(v.detector, v.kind) for v in s.verdicts] == [("logs", "crash")]


def test_engine_dead_line_confirmed_by_health_503():
    s = Script()
    s.advance(3)
    s.advance(0.5, log=("EngineDeadError: EngineCore encountered an issue.",))
    assert s.verdicts == []
    s.advance(1, health=503)
    assert [v.kind for v in s.verdicts] == ["crash"]


def unanswered_series(loop: WatchLoop, start: float, seconds: float, answered_at: float, latest: str | None,
                      sample: bool = False):
    """Ticks every 0.5 s of a server whose latest request got no answer (`latest`) since `answered_at`."""
    steps, now = [], start
    while now < start + seconds:
        now += 0.5
        metrics = MetricsSample(at=now, generation_tokens=0.0, prompt_tokens=0.0, running=0.0, waiting=0.0) if sample else None
        steps.append(loop.step(Observation(Tick(now=now, metrics=metrics), answered_at=answered_at, unanswered=latest)))
    return steps


def test_a_server_that_answers_nothing_is_hung_after_the_stall_threshold_counted_from_its_last_answer():
    loop = WatchLoop(build_watch_detectors)
    steps = unanswered_series(loop, 1000.0, 10, answered_at=1000.0, latest="/metrics: no answer within 5 s")
    verdicts = [(i, s.verdict) for i, s in enumerate(steps) if s.verdict]
    assert len(verdicts) == 1                      # once per episode
    i, v = verdicts[0]
    assert v.detector == "unanswered" and v.since == 1000.0 and 6.0 < v.at - 1000.0 <= 6.5
    assert "no answer within 5 s" in v.message and steps[-1].state == "hung"


def test_no_silence_while_the_server_answers_or_no_request_has_run_out_of_time():
    loop = WatchLoop(build_watch_detectors)
    assert not any(s.verdict for s in unanswered_series(loop, 1000.0, 20, answered_at=1000.0, latest=None))
    loop = WatchLoop(build_watch_detectors)
    steps = []
    for k in range(40):   # answered every second, a request timing out in between
        steps += unanswered_series(loop, 1000.0 + k, 1, answered_at=1000.0 + k, latest="/metrics: no answer within 5 s")
    assert not any(s.verdict for s in steps)


def test_the_silence_limit_is_the_learned_stall_threshold_or_the_configured_one():
    loop = WatchLoop(lambda: build_watch_detectors(threshold={"floor_s": 9.0, "ceiling_s": 30.0}))
    assert loop.silence_limit() == 9.0
    assert WatchLoop(build_watch_detectors, LoopConfig(unanswered_after_s=2.0)).silence_limit() == 2.0


def test_refused_beats_unanswered_and_a_hung_server_that_answers_again_recovers():
    loop = WatchLoop(build_watch_detectors, LoopConfig(canary_every_s=0))
    down = loop.step(Observation(Tick(now=1010.0), refused=True, answered_at=1000.0, unanswered="/health: x"))
    assert down.state == "down" and down.verdict is None
    loop = WatchLoop(build_watch_detectors, LoopConfig(canary_every_s=0))
    unanswered_series(loop, 1000.0, 8, answered_at=1000.0, latest="/health: no answer within 3 s")
    assert loop.state == "hung"
    gen = 0.0
    for k in range(6):   # /metrics answers again, and its counters move
        gen += 5
        step = loop.step(Observation(Tick(now=1010.0 + k, metrics=MetricsSample(at=1010.0 + k, generation_tokens=gen,
                                                                                 prompt_tokens=0.0, running=1.0)),
                                     answered_at=1010.0 + k))
    assert step.state == "busy"
