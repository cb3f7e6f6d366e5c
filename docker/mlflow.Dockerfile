# The MLflow tracking server of the compose stack, with the PostgreSQL driver.
FROM python:3.11-slim
RUN python -m pip install -q --no-cache-dir "mlflow>=3,<4" psycopg2-binary
EXPOSE 5000
