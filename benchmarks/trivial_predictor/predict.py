"""A predictor that does almost nothing, so a benchmark measures what serves it."""

from cog import BasePredictor, Input


class Predictor(BasePredictor):
    def setup(self) -> None:
        self.calls = 0

    def predict(
        self,
        text: str = Input(default="hello", description="text to repeat"),
        times: int = Input(default=2, ge=1, le=10, description="how many times"),
    ) -> str:
        self.calls += 1
        return text * times
