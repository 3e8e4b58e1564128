# Rendered by verlbox 0.1.0 from recipe "p40-cu124": do not edit by hand.
# P40 with a driver >= 550, PyPI and Debian only (torch cu124 wheels carry sm_60 code), Apex built from source
# Stages: system (base, Python, torch) -> apex-build -> final.

FROM debian:bookworm-slim AS system
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# system packages and the distribution's Python 3.11
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
RUN --mount=type=bind,source=verlbox-build/steps,target=/tmp/verlbox/steps \
    --mount=type=secret,id=ca_bundle,required=false \
    --mount=type=secret,id=pip_index_url,required=false \
    --mount=type=secret,id=apt_mirror,required=false \
    --mount=type=bind,source=verlbox-build/lock/python.apt.txt,target=/tmp/verlbox/lock/python.apt.txt \
    bash /tmp/verlbox/steps/steps.sh apt python ca-certificates python3 python3-venv python3-dev \
    && python3 -c 'import sys; assert "%d.%d" % sys.version_info[:2] == sys.argv[1], "base image has Python %d.%d" % sys.version_info[:2]' 3.11
RUN --mount=type=bind,source=verlbox-build/steps,target=/tmp/verlbox/steps \
    --mount=type=secret,id=ca_bundle,required=false \
    --mount=type=secret,id=pip_index_url,required=false \
    --mount=type=secret,id=apt_mirror,required=false \
    --mount=type=bind,source=verlbox-build/lock/python.pip.txt,target=/tmp/verlbox/lock/python.pip.txt \
    --mount=type=bind,source=verlbox-build/lock/python.pip.json,target=/tmp/verlbox/lock/python.pip.json \
    --mount=type=cache,id=verlbox-locked-files,target=/root/.cache/verlbox/locked-files,sharing=locked \
    python3 -m venv /opt/venv && bash /tmp/verlbox/steps/steps.sh pip python pip==25.1.1 uv==0.9.5
# PyTorch 2.6.0: the largest layer, kept early
RUN --mount=type=bind,source=verlbox-build/steps,target=/tmp/verlbox/steps \
    --mount=type=secret,id=ca_bundle,required=false \
    --mount=type=secret,id=pip_index_url,required=false \
    --mount=type=secret,id=apt_mirror,required=false \
    --mount=type=bind,source=verlbox-build/lock/torch.pip.txt,target=/tmp/verlbox/lock/torch.pip.txt \
    --mount=type=bind,source=verlbox-build/lock/torch.pip.json,target=/tmp/verlbox/lock/torch.pip.json \
    --mount=type=cache,id=verlbox-locked-files,target=/root/.cache/verlbox/locked-files,sharing=locked \
    bash /tmp/verlbox/steps/steps.sh pip torch torch==2.6.0 torchvision==0.21.0 torchaudio==2.6.0

FROM system AS apex-build
# NVIDIA Apex e13873debc4699d39c6861074b9a3b2a02327f92 from its hashed archive, compiled for sm 6.1 (no GPU
# is visible during a build, so the architectures come from the recipe). Only the wheel leaves this stage.
# CUDA toolkit from Debian trixie (main contrib non-free), unpacked at / without apt's dependency resolution
RUN --mount=type=bind,source=verlbox-build/steps,target=/tmp/verlbox/steps \
    --mount=type=secret,id=ca_bundle,required=false \
    --mount=type=secret,id=pip_index_url,required=false \
    --mount=type=secret,id=apt_mirror,required=false \
    --mount=type=bind,source=verlbox-build/lock/apex-compiler.apt.txt,target=/tmp/verlbox/lock/apex-compiler.apt.txt \
    bash /tmp/verlbox/steps/steps.sh apt apex-compiler g++
RUN --mount=type=bind,source=verlbox-build/steps,target=/tmp/verlbox/steps \
    --mount=type=secret,id=ca_bundle,required=false \
    --mount=type=secret,id=pip_index_url,required=false \
    --mount=type=secret,id=apt_mirror,required=false \
    bash /tmp/verlbox/steps/steps.sh toolkit trixie --component=main --component=contrib --component=non-free \
       'nvidia-cuda-toolkit=12.4.131~12.4.1-2' 'nvidia-cuda-dev=12.4.127~12.4.1-2' 'libnvvm4=12.4.131~12.4.1-2' 'libcudart12=12.4.127~12.4.1-2' libthrust-dev=2.3.2-2 libcub-dev=2.3.2-2 libcu++-dev=2.3.2-2
ENV CUDA_HOME=/usr
RUN --mount=type=bind,source=verlbox-build/steps,target=/tmp/verlbox/steps \
    --mount=type=secret,id=ca_bundle,required=false \
    --mount=type=secret,id=pip_index_url,required=false \
    --mount=type=secret,id=apt_mirror,required=false \
    --mount=type=bind,source=verlbox-build/lock/apex-build-tools.pip.txt,target=/tmp/verlbox/lock/apex-build-tools.pip.txt \
    --mount=type=bind,source=verlbox-build/lock/apex-build-tools.pip.json,target=/tmp/verlbox/lock/apex-build-tools.pip.json \
    --mount=type=cache,id=verlbox-locked-files,target=/root/.cache/verlbox/locked-files,sharing=locked \
    bash /tmp/verlbox/steps/steps.sh pip apex-build-tools packaging==25.0 setuptools==80.9.0 wheel==0.45.1 ninja==1.11.1.4
RUN --mount=type=bind,source=apex,target=/tmp/verlbox-apex \
    python3 /tmp/verlbox-apex/apex_build.py /tmp/verlbox-apex/plan.json /tmp/verlbox-apex/apex-e13873debc4699d39c6861074b9a3b2a02327f92.tar.gz /wheels \
    && mkdir -p /wheels/build-record && cp /opt/verlbox/build-record/*.json /wheels/build-record/

FROM system AS final
# verl 0.4.1 itself with --no-deps, then its dependencies, each pinned: two steps, one RUN (each
# RUN that mounts the build's secrets over freshly written layers waits for the engine, ~9 s here);
# verl first, so that a changed verl file fails the build before 100 other wheels are installed
RUN --mount=type=bind,source=verlbox-build/steps,target=/tmp/verlbox/steps \
    --mount=type=secret,id=ca_bundle,required=false \
    --mount=type=secret,id=pip_index_url,required=false \
    --mount=type=secret,id=apt_mirror,required=false \
    --mount=type=bind,source=verlbox-build/lock/verl.pip.txt,target=/tmp/verlbox/lock/verl.pip.txt \
    --mount=type=bind,source=verlbox-build/lock/verl.pip.json,target=/tmp/verlbox/lock/verl.pip.json \
    --mount=type=bind,source=verlbox-build/lock/verl-deps.pip.txt,target=/tmp/verlbox/lock/verl-deps.pip.txt \
    --mount=type=bind,source=verlbox-build/lock/verl-deps.pip.json,target=/tmp/verlbox/lock/verl-deps.pip.json \
    --mount=type=cache,id=verlbox-locked-files,target=/root/.cache/verlbox/locked-files,sharing=locked \
    bash /tmp/verlbox/steps/steps.sh pip verl --no-deps verl==0.4.1 \
    && bash /tmp/verlbox/steps/steps.sh pip verl-deps \
       accelerate==1.7.0 \
       codetiming==1.4.0 \
       datasets==3.6.0 \
       dill==0.3.8 \
       hydra-core==1.3.2 \
       numpy==1.26.4 \
       pandas==2.2.3 \
       peft==0.15.2 \
       pyarrow==20.0.0 \
       pybind11==2.13.6 \
       pylatexenc==2.10 \
       'ray[default]==2.47.1' \
       setuptools==80.9.0 \
       tensorboard==2.20.0 \
       tensordict==0.6.2 \
       torchdata==0.11.0 \
       transformers==4.51.3 \
       wandb==0.20.1 \
       torch==2.6.0 torchvision==0.21.0 torchaudio==2.6.0
# the source record goes into Apex's dist-info: smoke compares its commit with the recipe's; the wheel's
# sha256 into the build record, which `verlbox lock` pins (an offline build then takes that wheel only)
RUN --mount=type=bind,from=apex-build,source=/wheels,target=/tmp/apex-wheels \
    --mount=type=bind,source=verlbox-build/compiled.py,target=/tmp/verlbox/compiled.py \
    pip install --no-cache-dir --no-deps /tmp/apex-wheels/*.whl \
    && python3 /tmp/verlbox/compiled.py apex /tmp/apex-wheels \
    && mkdir -p /opt/verlbox/build-record/builder && cp /tmp/apex-wheels/build-record/apex-* /opt/verlbox/build-record/builder/ \
    && cp /tmp/apex-wheels/verlbox-source.json "$(python -c 'import importlib.metadata as m; print(m.distribution("apex")._path)')/"
# the verlbox runtime: entrypoint, smoke checks and the verl patch set (changes most often: last)
RUN --mount=type=bind,source=verlbox-build/steps,target=/tmp/verlbox/steps \
    --mount=type=secret,id=ca_bundle,required=false \
    --mount=type=secret,id=pip_index_url,required=false \
    --mount=type=secret,id=apt_mirror,required=false \
    --mount=type=bind,source=verlbox-build/lock/runtime.pip.txt,target=/tmp/verlbox/lock/runtime.pip.txt \
    --mount=type=bind,source=verlbox-build/lock/runtime.pip.json,target=/tmp/verlbox/lock/runtime.pip.json \
    --mount=type=cache,id=verlbox-locked-files,target=/root/.cache/verlbox/locked-files,sharing=locked \
    bash /tmp/verlbox/steps/steps.sh pip runtime pydantic==2.11.7 PyYAML==6.0.2 rich==14.0.0
COPY image-spec.json /opt/verlbox/image-spec.json
RUN --mount=type=bind,source=verlbox-src,target=/tmp/verlbox-src,rw \
    pip install --no-cache-dir --no-deps --no-build-isolation /tmp/verlbox-src \
    && verlbox patch-verl "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    && python -m verlbox.runtime.steps.placed write \
    && mkdir -p /workspace && chmod 1777 /workspace
ENV VERLBOX_IMAGE_SPEC=/opt/verlbox/image-spec.json \
    HF_HUB_OFFLINE=1 \
    HF_DATASETS_OFFLINE=1
WORKDIR /workspace
ENTRYPOINT ["verlbox"]
CMD ["train"]
LABEL org.opencontainers.image.title="verlbox p40-cu124" \
      org.opencontainers.image.description="P40 with a driver >= 550, PyPI and Debian only (torch cu124 wheels carry sm_60 code), Apex built from source" \
      io.verlbox.version="0.1.0" \
      io.verlbox.recipe="p40-cu124" \
      io.verlbox.recipe.hash="504d07ee9a78e364d0a608b1c1ed93fa42ccaf7beee142eda61a3c7a01f1131d" \
      io.verlbox.recipe.origin="shipped" \
      io.verlbox.base="debian:bookworm-slim" \
      io.verlbox.target-gpus="6.1" \
      io.verlbox.verl-patch-set.hash="bec889d444bfe47b457570a1f0adf5da446c230fbee4e7c24cdae5bf9f197c2e" \
      io.verlbox.lock.hash="82d45b8649d5443f5caa612a363562a672c456b8020085eec3a537fa9cc44475" \
      io.verlbox.pin.cuda="12.4" \
      io.verlbox.pin.python="3.11" \
      io.verlbox.pin.torch="2.6.0" \
      io.verlbox.pin.torchvision="0.21.0" \
      io.verlbox.pin.torchaudio="2.6.0" \
      io.verlbox.pin.verl="0.4.1" \
      io.verlbox.pin.accelerate="1.7.0" \
      io.verlbox.pin.codetiming="1.4.0" \
      io.verlbox.pin.datasets="3.6.0" \
      io.verlbox.pin.dill="0.3.8" \
      io.verlbox.pin.hydra-core="1.3.2" \
      io.verlbox.pin.numpy="1.26.4" \
      io.verlbox.pin.pandas="2.2.3" \
      io.verlbox.pin.peft="0.15.2" \
      io.verlbox.pin.pyarrow="20.0.0" \
      io.verlbox.pin.pybind11="2.13.6" \
      io.verlbox.pin.pylatexenc="2.10" \
      io.verlbox.pin.ray="2.47.1" \
      io.verlbox.pin.torchdata="0.11.0" \
      io.verlbox.pin.tensordict="0.6.2" \
      io.verlbox.pin.transformers="4.51.3" \
      io.verlbox.pin.tensorboard="2.20.0" \
      io.verlbox.pin.wandb="0.20.1" \
      io.verlbox.pin.setuptools="80.9.0" \
      io.verlbox.pin.apex="e13873debc4699d39c6861074b9a3b2a02327f92" \
      io.verlbox.pin.pydantic="2.11.7" \
      io.verlbox.pin.pyyaml="6.0.2" \
      io.verlbox.pin.rich="14.0.0"

# `verlbox bundle`: every file the lock names, fetched by its hash, for builds without a network
FROM system AS bundle-python
RUN --mount=type=bind,source=verlbox-build/steps,target=/tmp/verlbox/steps \
    --mount=type=secret,id=ca_bundle,required=false \
    --mount=type=secret,id=pip_index_url,required=false \
    --mount=type=secret,id=apt_mirror,required=false \
    --mount=type=cache,id=verlbox-locked-files,target=/root/.cache/verlbox/locked-files,sharing=locked \
    --mount=type=bind,source=verlbox-build/bundle,target=/tmp/verlbox/bundle \
    bash /tmp/verlbox/steps/steps.sh bundle-wheels /bundle/wheels

# from the system stage (the base plus Python, which build_steps.py needs), whose apt sources are the base's
FROM system AS bundle-debian
RUN --mount=type=bind,source=verlbox-build/steps,target=/tmp/verlbox/steps \
    --mount=type=secret,id=ca_bundle,required=false \
    --mount=type=secret,id=pip_index_url,required=false \
    --mount=type=secret,id=apt_mirror,required=false \
    --mount=type=bind,source=verlbox-build/bundle,target=/tmp/verlbox/bundle \
    bash /tmp/verlbox/steps/steps.sh bundle-debs /bundle/debs /bundle/debian

FROM scratch AS bundle
COPY --from=bundle-python /bundle/ /
COPY --from=bundle-debian /bundle/ /
COPY --from=apex-build /wheels/ /apex/
