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
