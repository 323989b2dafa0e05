// pipefill-sim --compare --frontier (src/cluster/compare.hpp, issue 32 item 4): where ours stands
// against each other strategy's point, read on ours' curve (straight between its points).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cluster/compare.hpp"

using namespace pipefill::cluster;

namespace {

FrontierPoint point(FillStrategy s, double filled_share, double slowdown_fraction) {
  FrontierPoint p;
  p.knob = "k";
  p.value = 1.0;
  p.row.strategy = s;
  p.row.name = strategy_name(s);
  p.row.result.filled_share = filled_share;
  p.row.result.slowdown_fraction = slowdown_fraction;
  return p;
}

std::string line_of(const std::string& report, const std::string& start) {
  const size_t at = report.find("\n" + start);
  if (at == std::string::npos) return "";
  const size_t end = report.find('\n', at + 1);
  return report.substr(at + 1, end - at - 1);
}

}  // namespace

TEST(CompareFrontier, VerdictsReadOursCurveAtEachPointsFilledShare) {
  // Ours: (80%, 0.10%) and (90%, 0.30%): at 85% its curve is at 0.20%.
  const std::vector<FrontierPoint> points{
      point(FillStrategy::Ours, 0.80, 0.0010), point(FillStrategy::Ours, 0.90, 0.0030),
      point(FillStrategy::PaperStyle, 0.85, 0.0025),  // above ours' 0.20% there
      point(FillStrategy::FreeRide, 0.85, 0.0015),    // below it
      point(FillStrategy::Tally, 0.95, 0.0050)};      // beyond ours' last point
  const std::string report = frontier_report(points);
  EXPECT_NE(line_of(report, "paper").find("0.200  ours lower"), std::string::npos) << report;
  EXPECT_NE(line_of(report, "freeride").find("0.200  OURS NOT LOWER"), std::string::npos) << report;
  EXPECT_NE(line_of(report, "tally").find("fills more than any ours point"), std::string::npos) << report;
  EXPECT_NE(report.find("ours lower at 1 of 2 points"), std::string::npos) << report;
}
