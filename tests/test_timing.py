"""The one timer (`runs.timing.time_calls`): every contender warmed up once, then called in
turn, round by round, so a drift in load reaches all of them alike."""

from equarx_ref.runs.timing import medians, time_calls


def test_calls_take_turns_round_by_round_after_one_warm_up_each():
    order = []
    calls = {name: (lambda name=name: order.append(name)) for name in ("a", "b", "c")}
    times = time_calls(calls, 3, before=lambda: order.append("|"))
    assert order == ["a", "b", "c"] + ["|", "a", "|", "b", "|", "c"] * 3
    assert list(times) == ["a", "b", "c"] and all(len(t) == 3 for t in times.values())
    assert all(t >= 0 for ts in times.values() for t in ts)
    assert medians({"x": [3.0, 1.0, 2.0]}) == {"x": 2.0}
