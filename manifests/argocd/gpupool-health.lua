-- Argo CD health of a sailplan.dev GPUPool: its Ready condition (ready nodes) and
-- GPUTypeResolved (the GPU type is one the planner knows).
local hs = {status = "Progressing", message = "waiting for the operator"}
if obj.status ~= nil and obj.status.conditions ~= nil then
  local ready, resolved = nil, nil
  for _, condition in ipairs(obj.status.conditions) do
    if condition.type == "Ready" then ready = condition end
    if condition.type == "GPUTypeResolved" then resolved = condition end
  end
  if resolved ~= nil and resolved.status == "False" then
    hs.status = "Degraded"
    hs.message = resolved.reason .. ": " .. (resolved.message or "")
  elseif ready ~= nil and ready.status == "True" then
    hs.status = "Healthy"
    hs.message = ready.message or ready.reason
  elseif ready ~= nil then
    hs.status = "Degraded"
    hs.message = ready.reason .. ": " .. (ready.message or "")
  end
end
return hs
