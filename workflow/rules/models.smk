# Models the pipeline builds itself: the offline demo masked LM (see src/biasflow/models/demo.py).

rule build_demo_model:
    input:
        texts=W.demo_training_texts(),
    output:
        directory(RESOURCES + "/models/{model_name}"),
    params:
        model=lambda w: W.build_params(f"{RESOURCES}/models/{w.model_name}"),
    log:
        RESULTS + "/logs/build_model/{model_name}.log",
    benchmark:
        benchmark_file(RESULTS, "build_demo_model", "{model_name}")
    threads: lambda w: W.build_threads(f"{RESOURCES}/models/{w.model_name}", workflow)
    priority: BUILD_PRIORITY
    script:
        "../../scripts/build_demo_model.py"
