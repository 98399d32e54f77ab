-- Argo CD health of a sailplan.dev TrainingJob, from its status phase and conditions.
-- Running/Succeeded: Healthy. Pending/Replanning (planning, pods starting, a switch):
-- Progressing. Suspended (spec.suspend): Suspended. Failed, Unschedulable, Invalid:
-- Degraded, with the condition's message.
local hs = {}
local function message(types)
  if obj.status ~= nil and obj.status.conditions ~= nil then
    for _, type in ipairs(types) do
      for _, condition in ipairs(obj.status.conditions) do
        if condition.type == type and condition.message ~= nil and condition.message ~= "" then
          return condition.reason .. ": " .. condition.message
        end
      end
    end
  end
  return nil
end
local phase = nil
if obj.status ~= nil then
  phase = obj.status.phase
end
if phase == "Running" then
  hs.status = "Healthy"
  hs.message = "training"
elseif phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = "training complete"
elseif phase == "Suspended" then
  hs.status = "Suspended"
  hs.message = message({"Suspended"}) or "suspended"
elseif phase == "Failed" or phase == "Unschedulable" or phase == "Invalid" then
  hs.status = "Degraded"
  hs.message = message({"Failed", "Valid", "Invalid", "Schedulable", "Unschedulable"}) or phase
else
  hs.status = "Progressing"
  hs.message = message({"Planning", "Replanning", "Running"}) or (phase or "waiting for the operator")
end
return hs
