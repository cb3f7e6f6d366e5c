# consistency-gate with a CPU build of torch. Entry point: the consistency-gate command.
#   docker build -t consistency-gate .
#   docker run --rm -e MLFLOW_TRACKING_URI=http://mlflow:5000 -v "$PWD/data:/data" consistency-gate \
#       check --model my-model --data /data/eval.csv
FROM python:3.11-slim

# pip takes torch's CPU wheels from PyTorch's index, everything else from PyPI, so the install
# commands below stay exactly those of .ci/run.
ENV PIP_INDEX_URL=https://download.pytorch.org/whl/cpu \
    PIP_EXTRA_INDEX_URL=https://pypi.org/simple \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    MPLBACKEND=Agg \
    NUMBA_CACHE_DIR=/opt/numba-cache

WORKDIR /app
# the dependencies first (torch first), read from pyproject.toml, so that a change to the source
# rebuilds only the layers below them and does not reinstall torch
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && python -m pip install -q torch==2.13.0 && python -m pip install -q -r /tmp/requirements.txt
COPY consistency_gate ./consistency_gate
RUN python -m pip install -q --no-deps .
# compile the metric kernels once, here, for every user of the image (else each container compiles them)
RUN python -c "from consistency_gate.core.kernels import precompile; precompile()" && chmod -R a+rwX /opt/numba-cache

RUN useradd --create-home gate
USER gate
WORKDIR /work
ENTRYPOINT ["consistency-gate"]
CMD ["--help"]
