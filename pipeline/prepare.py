"""DVC stage `prepare`: load the configured data set, split and normalise it, write data/prepared/.

Run: python pipeline/prepare.py [--params params.yaml] [--raw data/raw] [--out data/prepared]
"""

from __future__ import annotations

from pathlib import Path

import click

from _common import debug_option, folder_option, layout, params_option, stage


@click.command()
@params_option
@folder_option("--raw", "raw_dir", str(layout.RAW), "Folder holding raw downloads (mnist, fashion_mnist, cifar10).")
@folder_option("--out", "out_dir", str(layout.PREPARED), "Folder to write the prepared tensors and meta.json into.")
@debug_option
@stage
def main(params, raw_dir: Path, out_dir: Path) -> None:
    """Prepare the data set named by prepare.dataset."""
    from ampbench.data import prepare, save_prepared

    data = prepare(params.prepare, raw_dir)
    save_prepared(data, out_dir)
    m = data.meta
    click.echo(f"prepared {m['dataset']}: input {tuple(m['input_shape'])}, {len(m['classes'])} classes, "
               f"splits {m['sizes']} → {out_dir}")


if __name__ == "__main__":
    main()
