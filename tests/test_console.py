"""The console: a pure render() and the plain reporter."""
import io

from rich.console import Console

from popplay.console import PlainReporter, format_rate, format_seconds, plain_line, render, reporter_for
from popplay.runner import Progress


def _progress(**kw):
    base = dict(domain="bandit", phase=5, agent_steps=2048, budget_agent_steps=8192, learning_seconds=1.5,
                time_budget=None, agent_steps_per_second=3.2e7, metrics={"quality": 0.9375})
    base.update(kw)
    return Progress(**base)


def _text(renderable) -> str:
    console = Console(file=io.StringIO(), width=100, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_render_shows_progress_eta_quality_rate_and_shares():
    text = _text(render(_progress()))
    assert "25.0%" in text
    assert "ETA  4.5s" in text  # 1.5 s for a quarter of the steps
    assert "quality" in text and "0.9375" in text
    assert "32.0M" in text and "shares" in text and "5" in text
    assert "2,048 / 8,192" in text


def test_render_is_pure():
    p = _progress()
    assert _text(render(p)) == _text(render(p))


def test_time_budget_progress_and_eta():
    p = _progress(time_budget=6.0, budget_agent_steps=None)
    assert p.fraction == 0.25 and p.eta_seconds == 4.5
    assert "1.5s /  6.0s" in _text(render(p))


def test_formatting_helpers():
    assert format_rate(1.25e9) == "1.2G" and format_rate(999) == "999"
    assert format_seconds(75) == "1:15" and format_seconds(3725) == "1:02:05" and format_seconds(None) == "--:--"
    assert "quality=0.9375" in plain_line(_progress())


def test_plain_reporter_prints_lines_without_escape_codes():
    stream = io.StringIO()
    reporter = PlainReporter(stream, interval=3600)
    reporter.update(_progress())
    reporter.update(_progress(phase=6))  # throttled
    reporter.update(_progress(phase=7, done=True))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and "\x1b" not in stream.getvalue()
    assert isinstance(reporter_for(io.StringIO()), PlainReporter)
