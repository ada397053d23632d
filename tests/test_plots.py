"""course_utils.plots: the grid puts each image where it belongs; curves and bars draw what they get."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course_utils import plots  # noqa: E402


def test_image_grid_layout():
    images = torch.stack([torch.full((3, 4, 4), v) for v in (0.1, 0.5, 0.9)])  # 3 flat images
    grid = plots.image_grid(images, nrow=2, pad=1)
    assert grid.shape == (2 * 5 + 1, 2 * 5 + 1, 3)
    assert np.allclose(grid[1:5, 1:5], 0.1) and np.allclose(grid[1:5, 6:10], 0.5)
    assert np.allclose(grid[6:10, 1:5], 0.9) and np.allclose(grid[6:10, 6:10], 1.0)  # padding
    gray = plots.image_grid(torch.rand(2, 1, 4, 4) * 3, nrow=2)           # values clipped
    assert gray.shape[-1] == 3 and gray.max() <= 1.0
    assert plots.image_grid(torch.rand(1, 1, 4, 4)).shape == (4, 4, 3)    # one image: no border
    with pytest.raises(TypeError, match="nrow"):
        plots.image_grid(images, nrow=True)


def test_show_images_with_labels_and_dataset_like():
    fig = plots.show_images(torch.rand(6, 3, 8, 8), nrow=3, labels=[0, 1, 2, 0, 1, 2],
                            classes=["a", "b", "c"], title="t")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == ["a", "b", "c", "a", "b", "c"]
    plt.close(fig)

    class Like:
        images, labels, classes = torch.rand(2, 1, 8, 8), torch.tensor([1, 0]), ["zero", "one"]
    fig = plots.show_images(Like())
    assert [t.get_text() for t in fig.axes[0].texts] == ["one", "zero"]
    plt.close(fig)
    with pytest.raises(ValueError, match="C = 1 or 3"):
        plots.show_images(torch.rand(2, 4, 8, 8))
    with pytest.raises(ValueError, match="one label per image"):
        plots.show_images(torch.rand(3, 3, 8, 8), labels=[0])


def test_plot_curves_from_history_like():
    class History:
        def as_dict(self):
            return {"step": [1, 2, 3], "loss": [3.0, 2.0, 1.0], "eval_acc": [0.5], "eval_step": [3]}
    fig = plots.plot_curves(History())
    titles = [a.get_title() for a in fig.axes]
    assert titles == ["loss", "eval_acc"]
    x, y = fig.axes[0].lines[0].get_data()
    assert list(x) == [1, 2, 3] and list(y) == [3.0, 2.0, 1.0]
    assert list(fig.axes[1].lines[0].get_data()[0]) == [3]
    plt.close(fig)
    fig, ax = plt.subplots()
    plots.plot_curves({"a": [1, 2], "b": [2, 1]}, ax=ax)
    assert len(ax.lines) == 2
    plt.close(fig)
    with pytest.raises(ValueError, match="not in the history"):
        plots.plot_curves({"loss": [1.0]}, keys=["acc"])


def test_plot_bars():
    fig = plots.plot_bars({"simclr": 2.0, "mae": 0.5}, ylabel="GFLOP")
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert heights == [2.0, 0.5]
    plt.close(fig)
    with pytest.raises(ValueError, match="non-empty"):
        plots.plot_bars({})
