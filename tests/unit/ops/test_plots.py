from asyncrl.ops.plots import line_plot


def test_line_plot_writes_a_png(tmp_path):
    path = line_plot(
        {"a": [(0.0, 0.4), (1.5, 0.7), (3.0, 0.92)], "b": []},
        tmp_path / "sub" / "curves.png",
        title="t",
        xlabel="s",
        ylabel="acc",
        hline=0.9,
        hline_label="target",
    )
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 5_000  # axes, lines and a legend, not an empty canvas


def test_whole_number_axes_get_whole_number_ticks():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from asyncrl.ops.plots import _integer_ticks

    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [0.1, 0.2, 0.3])  # three weight versions: ticks at 1.0, 1.25, ... by default
    _integer_ticks(ax, [1, 2, 3])
    fig.canvas.draw()
    assert all(float(t).is_integer() for t in ax.get_xticks())
    plt.close(fig)


def test_a_long_run_s_bars_are_binned_to_a_bounded_number(tmp_path, monkeypatch):
    """Tens of thousands of syncs drew a bar each: the report of a long run spent minutes in
    matplotlib. Past MAX_BARS the plot draws means of consecutive bars."""
    from matplotlib.axes import Axes

    from asyncrl.ops import plots

    drawn: list[int] = []
    bar = Axes.bar
    monkeypatch.setattr(
        Axes, "bar", lambda ax, x, *a, **kw: drawn.append(len(x)) or bar(ax, x, *a, **kw)
    )
    n = 10 * plots.MAX_BARS + 3
    x = list(range(1, n + 1))
    path = plots.stacked_bars(
        x, {"a": [1.0] * n, "b": [float(v) for v in x]}, tmp_path / "s.png", "t", "v", "ms"
    )
    assert path.stat().st_size > 0
    assert drawn and max(drawn) <= plots.MAX_BARS
    xs, parts, size = plots.bin_bars(x, {"b": [float(v) for v in x]}, plots.MAX_BARS)
    assert size == 11 and len(xs) <= plots.MAX_BARS
    assert xs[0] == 6.0 and parts["b"][0] == 6.0  # the mean of bars 1-11
    assert xs[-1] == parts["b"][-1] == (n - (n - 1) % size + n) / 2  # the last, shorter run
